"""Frontend processes (--frontend-processes N > 1): HTTP and gRPC served by N processes on one port each.

The supervisor (the "core") keeps the repository, schedulers, instances, statistics, metrics, cache and
client shared-memory registry. Each frontend process (`frontend_main.py`) binds the HTTP and gRPC ports
with SO_REUSEPORT and runs the ordinary http_api / grpc_api servers over a `RemoteDataPlane`, which talks
to the core over one Unix-socket link (`link.py`, frames of `frames.py`). The core side is `core_link.py`
(serving every link) and `processes.py` (starting, restarting and stopping the frontend processes).
With N == 1 nothing here is used: the frontends run in the supervisor over its data plane, as before.
"""
