"""inferd's PyTriton-compatible Python API (import name `inferd.pytriton`; see docs/python-api.md).

PyTriton code switches by its import lines only: `from pytriton.triton import Triton` becomes
`from inferd.pytriton.triton import Triton`. Bound functions run in this process, which hosts them as the
workers of their models; the server (`python -m inferd.supervisor`) runs as a child process. This package
is worker-side: it never imports `inferd.supervisor`.
"""
