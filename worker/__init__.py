"""inferd worker: runs one model instance; started as `python -m inferd.worker`."""
