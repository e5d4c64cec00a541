"""Triton's generate extension (docs/protocol/extension_generate.md), checked against Triton 2.51.

POST /v2/models/{m}[/versions/{v}]/generate and /generate_stream take one JSON object: a key that
names a model input becomes that input (a JSON scalar or array, shaped by the config's dims), any
other key a request parameter, "parameters" an object of more of either, "id" the request id.
A response is one JSON object: model_name, model_version, id (when given) and every output by name
(a one-element output as a scalar, else a flat array; BYTES as strings).

- /generate answers that one object (application/json). A decoupled model must send exactly one
  response; otherwise the answer is Triton's "generate expects model to produce exactly 1
  response..." error (Triton sends it with status 200; we use 400, as for its error responses).
- /generate_stream answers server-sent events (text/event-stream; charset=utf-8), one
  `data: {...}\\n\\n` per response, an error response as `data: {"error": "..."}`. As Triton: the
  status is that of the first response, so a model that fails before its first response starts the
  stream with 400 (its error as the first event, the responses after it follow); a refusal of the
  request itself (unknown model, bad or missing inputs, a full queue) is a plain JSON error with its
  status. The body is chunked and the connection closes after it; a client that drops the connection
  cancels the request.
- A model's error answers /generate with 400 whatever its code, as Triton answers it.
- A request with the header `endpoint-load-metrics-format: text|json` gets the `endpoint-load-metrics` load
  report with its answer, as Triton 2.57 and later send it (supervisor/orca.py), unless the request itself
  was refused.

A key given twice reads as Triton's JSON reads it: each member name in document order, with the value
of its first occurrence, so an input named twice is refused ("input 'X' already exists in request")
and a parameter named twice keeps its first value; "parameters" is read where it stands (a parameter
both at the top and in "parameters" takes the later one).

Errors in the request body are 400 with a message naming the problem (Triton answers several of
them with 500).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import orjson
from inferd.supervisor.core.dataplane import DataPlane, ResponseError
from inferd.supervisor.http_api.orca import REQUEST_HEADER as LOAD_REPORT_FORMAT
from inferd.supervisor.http_api.orca import RESPONSE_HEADER as LOAD_REPORT
from inferd.supervisor.inference.tensors import json_to_raw, raw_to_json
from inferd.supervisor.inference.types import InferRequest, InferResponse, Tensor
from inferd.worker.wire.errors import InferdError, invalid_arg

from . import errors
from .compression import decode_content
from .request_cycle import Response

FINAL = "triton_final_response"
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
_ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                 "generates various number of responses")
_RESERVED = ("id", "parameters")


class StreamingResponse(Response):
    """A response whose body is produced while it is written: `chunks` (an async iterator of bytes)
    goes out with chunked transfer encoding; the connection stays open after it (keep-alive, as Triton)."""

    __slots__ = ("chunks",)

    def __init__(self, chunks: AsyncIterator[bytes], content_type: str = SSE_CONTENT_TYPE,
                 status: int = 200) -> None:
        super().__init__(status, b"", content_type)
        self.chunks = chunks


class _Members(dict):  # type: ignore[type-arg]
    """A JSON object as Triton reads one: `names` every member name in order (repeats included), each
    name's value that of its first occurrence."""

    __slots__ = ("names",)
    names: list[str]


def _members(pairs: list[tuple[str, Any]]) -> _Members:
    obj = _Members()
    obj.names = [k for k, _ in pairs]
    for k, v in pairs:
        obj.setdefault(k, v)
    return obj


# ---- request ----------------------------------------------------------------------------------


def _param_value(key: str, value: Any, where: str) -> Any:
    if isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise invalid_arg(f"{where}parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def _input_shape(name: str, dims: list[int], batched: bool, count: int) -> list[int]:
    """The config's dims with a batch of 1 and the variable dims sized so that `count` elements fit."""
    shape = [int(d) for d in dims]
    known = 1
    for d in shape:
        if d >= 0:
            known *= d
    variable = [i for i, d in enumerate(shape) if d < 0]
    if variable:
        if known == 0 or count % known:
            raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
        shape = [1 if d < 0 else d for d in shape]
        shape[variable[0]] = count // known
    elif known != count:
        raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
    return [1, *shape] if batched else shape


def _input_tensor(name: str, value: Any, spec: dict[str, Any], batched: bool) -> Tensor:
    data = value if isinstance(value, list) else [value]
    flat: list[Any] = data
    if data and isinstance(data[0], list):  # nested: flattened (depth-capped) by json_to_raw's rules
        flat = []
        stack = [iter(data)]
        while stack:
            for item in stack[-1]:
                if isinstance(item, list):
                    if len(stack) >= 64:
                        raise invalid_arg(f"input '{name}' is nested too deeply")
                    stack.append(iter(item))
                    break
                flat.append(item)
            else:
                stack.pop()
    datatype = str(spec.get("data_type", "")).removeprefix("TYPE_")
    datatype = "BYTES" if datatype == "STRING" else datatype
    shape = _input_shape(name, list(spec.get("dims") or []), batched, len(flat))
    return Tensor(name, datatype, shape, json_to_raw(datatype, shape, flat, name))


def parse_request(dp: DataPlane, model: str, version: str, body: Any, max_size: int,
                  encoding: str | None) -> InferRequest:
    """The InferRequest of a generate body; InferdError(INVALID_ARG) naming what is wrong."""
    handle = dp.model(model, version)  # unknown model / version: NOT_FOUND first, as Triton
    config = handle.config()
    raw = decode_content(encoding, body, max_size)
    try:
        doc = orjson.loads(raw)  # (the checks and the messages: NaN, integer range, depth)
        if isinstance(doc, dict):
            doc = json.loads(raw, object_pairs_hook=_members)  # (repeated names: the module's docstring)
    except (orjson.JSONDecodeError, RecursionError, ValueError) as exc:
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, _Members):
        raise invalid_arg("the generate request body must be a JSON object")
    specs = {str(i.get("name")): i for i in config.get("input") or [] if isinstance(i, dict)}
    batched = int(config.get("max_batch_size") or 0) > 0
    request = InferRequest(model_name=model, model_version=version, model=handle)
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise invalid_arg("'id' must be a string")
    request.id = request_id
    inputs: dict[str, Tensor] = {}

    def take(key: str, value: Any, where: str) -> None:
        if key in specs:
            if key in inputs:
                raise invalid_arg(f"{where}[request id: {request_id or '<id_unknown>'}] input '{key}' already "
                                  "exists in request")
            inputs[key] = _input_tensor(key, value, specs[key], batched)
        else:
            request.parameters[key] = _param_value(key, value, where)

    for key in doc.names:  # (in order, repeats included: Triton reads the first value each time)
        if key == "parameters":
            params = doc[key]
            if params is None:
                continue
            if not isinstance(params, _Members):
                raise invalid_arg("Expected JSON object for keyword: 'parameters'")
            for name in params.names:
                take(name, params[name], "Converting keyword: 'parameters': ")
        elif key not in _RESERVED:
            take(key, doc[key], "")
    request.inputs = list(inputs.values())
    return request


# ---- response ---------------------------------------------------------------------------------


def response_json(resp: InferResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"model_name": resp.model_name, "model_version": resp.model_version}
    if resp.id:
        out["id"] = resp.id
    for tensor in resp.outputs:
        values = raw_to_json(tensor.datatype, tensor.shape, tensor.data, tensor.name)
        out[tensor.name] = values[0] if len(values) == 1 else values
    return out


def _is_data(resp: InferResponse) -> bool:
    """A response with outputs, or any response that is not a flag-only final."""
    return bool(resp.outputs) or not resp.parameters.get(FINAL, False)


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


_ERROR_EVENT = b'data: {"error":'


def _error_event(message: str) -> bytes:
    return _sse({"error": message})


async def _one(event: bytes) -> AsyncIterator[bytes]:
    yield event


# ---- endpoints --------------------------------------------------------------------------------


class Generate:
    def __init__(self, dataplane: DataPlane, max_input_size: int) -> None:
        self.dp = dataplane
        self.max_input_size = max_input_size

    def _request(self, req: Any, model: str, version: str) -> InferRequest:
        return parse_request(self.dp, model, version, req.body, self.max_input_size,
                             req.headers.get("content-encoding"))

    def generate(self, req: Any, model: str, version: str) -> Any:
        request = self._request(req, model, version)
        return self._generate(request, req.headers.get(LOAD_REPORT_FORMAT))

    async def _load_report(self, fmt: str | None, model: str) -> dict[str, str] | None:
        """The headers of an accepted request's answer: the load report it asked for, if there is one."""
        if fmt is None:
            return None
        try:
            value = await self.dp.load_report_async(fmt, model)
        except InferdError:  # (the core out of reach) the answer goes without a report rather than not at all
            return None
        return {LOAD_REPORT: value} if value else None

    async def _generate(self, request: InferRequest, load_format: str | None = None) -> Response:
        """One response expected: an error response counts as one (answered 400, as Triton); an
        error before any response keeps its own status."""
        response, accepted = await self._generate_one(request)
        if accepted and load_format is not None:
            response.headers = await self._load_report(load_format, request.model_name)
        return response

    async def _generate_one(self, request: InferRequest) -> tuple[Response, bool]:
        """(the answer, whether the request was accepted: not refused before its first response)"""
        responses = self.dp.stream_infer(request)
        items: list[InferResponse | InferdError] = []
        try:
            async for item in responses:
                if isinstance(item, InferdError) or _is_data(item):
                    items.append(item)
                    if len(items) > 1:  # closing the iterator below cancels the rest
                        break
        except InferdError as exc:
            if not items and not isinstance(exc, ResponseError):
                return errors.from_inferd_error(exc), False  # a refusal of the request: its own status
            items.append(exc)
        finally:
            await responses.aclose()
        if len(items) != 1:
            return errors.error_response(400, _ONE_RESPONSE), True
        item = items[0]
        try:
            if isinstance(item, InferdError):
                raise item
            return Response(200, orjson.dumps(response_json(item))), True
        except InferdError as exc:
            return errors.error_response(400, exc.message), True

    def generate_stream(self, req: Any, model: str, version: str) -> Any:
        request = self._request(req, model, version)
        return self._generate_stream(request, req.headers.get(LOAD_REPORT_FORMAT))

    async def _generate_stream(self, request: InferRequest, load_format: str | None = None) -> Response:
        """Waits for the first event: its status is the stream's (400 for an error response, as Triton), and
        a refusal of the request before it keeps its own status as a plain JSON error."""
        responses = self.dp.stream_infer(request)
        try:
            first = await self._next_event(responses)
        except ResponseError as exc:  # the request's only answer is an error: a stream of that one event
            await responses.aclose()
            failed = StreamingResponse(_one(_sse({"error": exc.message})), status=400)
            failed.headers = await self._load_report(load_format, request.model_name)
            return failed
        except InferdError as exc:
            await responses.aclose()
            return errors.from_inferd_error(exc)
        except BaseException:
            await responses.aclose()
            raise
        status = 400 if first is not None and first.startswith(_ERROR_EVENT) else 200
        stream = StreamingResponse(self._events(first, responses), status=status)
        try:
            stream.headers = await self._load_report(load_format, request.model_name)
        except BaseException:
            await responses.aclose()
            raise
        return stream

    async def _next_event(self, responses: AsyncIterator[Any]) -> bytes | None:
        """The next SSE event (None at the end); an error ending the stream before any event is raised."""
        async for item in responses:
            if isinstance(item, InferdError):
                return _error_event(item.message)
            if _is_data(item):
                return _sse(response_json(item))
        return None

    async def _events(self, first: bytes | None, responses: Any) -> AsyncIterator[bytes]:
        try:
            event = first
            while event is not None:
                yield event
                try:
                    event = await self._next_event(responses)
                except InferdError as exc:  # the request ended with an error
                    yield _sse({"error": exc.message})
                    return
        finally:
            await responses.aclose()
