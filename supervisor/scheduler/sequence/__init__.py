"""The sequence batcher (`sequence_batching`): `scheduler.py` (SequenceScheduler) keeps each sequence on its slot
(`lanes.py`) and gives the worker the control inputs (`controls.py`) and implicit state (`state.py`) in the
requests `requests.py` builds."""
