"""BLS as pb_utils gives it: the response iterator of `exec(decoupled=True)`, a reply turned into an
InferenceResponse, and model control from Python (load_model, unload_model, is_model_ready), all through
the worker's BLS client (worker/bls.py). InferenceRequest.exec/async_exec (_pb_request.py) send the calls."""

from __future__ import annotations

from typing import Any, Optional

from .. import pb_args as _args
from ._pb_base import TritonError, TritonModelException
from ._pb_response import InferenceResponse
from ._pb_tensor import Tensor


class _ResponseIterator:
    """`exec(decoupled=True)`: responses as they arrive; the last one is final (possibly empty, as
    Triton's). Dropping the iterator early cancels the request. As python_backend's, it keeps what it
    received: once the final response came, iterating it again yields every response again."""

    def __init__(self, client: Any, call_id: int, call: Any, timeout_us: int) -> None:
        self._client = client
        self._call_id = call_id
        self._replies = client.stream(call, _wait_s(timeout_us))
        self._finished = False
        self._responses: list[InferenceResponse] = []
        self._next = 0  # index in _responses of the next one to yield

    def __iter__(self) -> _ResponseIterator:
        if self._finished and self._next >= len(self._responses):
            self._next = 0
        return self

    def cancel(self) -> None:
        """Cancel the call (python_backend after 2.51): the callee sees `is_cancelled()`, and the stream
        ends with a final cancellation error."""
        if not self._finished:
            self._client.cancel(self._call_id)

    def __next__(self) -> InferenceResponse:
        if self._next < len(self._responses):
            self._next += 1
            return self._responses[self._next - 1]
        if self._finished or not self._receive():
            raise StopIteration
        self._next += 1
        return self._responses[-1]

    def _receive(self) -> bool:
        """Wait for the next response and keep it; False: the stream had ended."""
        try:
            reply = next(self._replies)
        except StopIteration:
            self._finished = True
            return False
        except TritonModelException:
            self._finished = True
            raise
        except Exception as exc:  # the deadline passed
            self._finished = True
            self._client.cancel(self._call_id)
            self._client.forget(self._call_id)
            self._responses.append(
                InferenceResponse(error=TritonError(str(getattr(exc, "message", exc)), TritonError.UNAVAILABLE)))
            return True
        if reply.final:
            self._finished = True
        self._responses.append(_to_response(reply))
        return True

    def _first(self) -> None:
        """Wait for the first response (async_exec runs this off the event loop, as python_backend)."""
        if not self._responses and not self._finished:
            self._receive()

    def __del__(self) -> None:
        if not self._finished:
            try:
                self._client.cancel(self._call_id)
                self._client.forget(self._call_id)
            except Exception:  # noqa: S110 - the worker may be exiting
                pass


def _bls() -> Any:
    from inferd.worker import bls
    from inferd.worker.wire.errors import InferdError

    try:
        return bls.client()
    except InferdError as exc:
        raise TritonModelException(exc.message) from None


def _wait_s(timeout_us: Any) -> Optional[float]:
    """How long the model waits for a reply: the supervisor enforces the request's timeout itself,
    so this is only a backstop (a lost reply) well beyond it."""
    timeout = int(timeout_us or 0)
    return None if timeout <= 0 else timeout / 1e6 + 5.0


def _to_response(reply: Any) -> InferenceResponse:
    error = None
    if reply.error is not None:
        error = TritonError(reply.error.message, int(reply.error.code))
    outputs = [Tensor._wrap(name, array, datatype) for name, datatype, array in reply.outputs]
    return InferenceResponse(outputs, error, reply.parameters or None)


# ---- model control from Python ------------------------------------------------------------------


def _control(op: str, model_name: str, **kwargs: Any) -> Any:
    result = _bls().control(op, model_name, **kwargs)
    if result.error is not None:
        raise TritonModelException(result.error.message)
    return result


def load_model(model_name: str, config: str = "", files: Optional[dict[str, bytes]] = None) -> None:
    """Load (or reload) a model; the server must run with --model-control-mode explicit."""
    _control("load", _args.text(model_name, "model_name"), config=_args.text(config or "", "config"),
             files=dict(files or {}))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _control("unload", _args.text(model_name, "model_name"), unload_dependents=bool(unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    version = model_version if isinstance(model_version, (str, bytes)) else str(_args.integer(model_version,
                                                                                                  "model_version"))
    return bool(_control("ready", _args.text(model_name, "model_name"),
                         model_version=_args.text(version, "model_version")).ready)

