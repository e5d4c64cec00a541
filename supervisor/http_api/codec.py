"""KServe v2 inference over HTTP: request body -> InferRequest, InferResponse -> response body.

Covers the JSON form, the binary tensor extension (JSON header + blobs, and the raw single-input form
with an `Inference-Header-Content-Length` of 0), shared-memory inputs and outputs, request
parameters, and Content-Encoding both ways. Every size a client declares is checked against the
bytes actually present before anything is allocated from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from inferd.supervisor.core.classification import CLASSIFICATION_WITH_SHM
from inferd.supervisor.core.dataplane import DataPlane
from inferd.supervisor.core.model_handle import ModelHandle
from inferd.supervisor.inference import limits, tensors
from inferd.supervisor.inference.types import (
    SEQUENCE_END,
    SEQUENCE_START,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
)
from inferd.worker.wire.dtypes import BY_NAME
from inferd.worker.wire.errors import internal, invalid_arg

from . import json_nonfinite, templates
from .json_request import parse_plain
from .json_template import JsonTemplates
from .parsed import OutputPlan, ParsedInfer
from .server import Response

UINT64_MAX = (1 << 64) - 1
_JOIN_BYTES = 16384  # binary outputs up to this size are joined with the JSON into one body
_SHM_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")
# datatype -> (item size, array typecode or None): what `build` looks up once per output
_OUTPUT_TYPES = {name: (dt.itemsize, tensors.ARRAY_CODES.get(name)) for name, dt in BY_NAME.items()}


def _load_doc(head: Any) -> dict[str, Any]:
    """A request's JSON header as a dict; 400 for anything else."""
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as exc:  # perhaps a NaN or Infinity, which Triton reads
        doc = json_nonfinite.loads(head, exc)
    except (RecursionError, ValueError) as exc:
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if type(doc) is not dict:
        raise invalid_arg("the inference request must be a JSON object")
    return doc


@dataclass(frozen=True)
class Limits:
    max_input_size: int = 64 * 1024 * 1024  # body cap, after decompression (--http-max-input-size)
    max_tensors: int = limits.MAX_TENSORS  # inputs, and requested outputs, per request
    max_name_len: int = 256
    max_parameters: int = limits.MAX_PARAMETERS
    max_depth: int = limits.MAX_DIMS


# ---------------------------------------------------------------- small field checks

def _is_uint(v: Any) -> bool:
    return type(v) is int and 0 <= v <= UINT64_MAX


def _name_of(obj: Any, what: str, limits: Limits) -> str:
    if not isinstance(obj, dict):
        raise invalid_arg(f"each {what} must be a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_arg(f"each {what} must have a non-empty string 'name'")
    if len(name) > limits.max_name_len:
        raise invalid_arg(f"{what} name of {len(name)} characters exceeds the maximum {limits.max_name_len}")
    return name


def _params(obj: dict[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise invalid_arg(f"'parameters' of {where} must be a JSON object")
    return params


def _shm_params(params: dict[str, Any], name: str) -> tuple[str, int, int]:
    region = params.get("shared_memory_region")
    size: Any = params.get("shared_memory_byte_size")
    offset: Any = params.get("shared_memory_offset", 0)
    if not isinstance(region, str) or not region:
        raise invalid_arg(f"'shared_memory_region' of tensor '{name}' must be a non-empty string")
    if not _is_uint(size):
        raise invalid_arg(f"tensor '{name}' must give a non-negative integer 'shared_memory_byte_size'")
    if not _is_uint(offset):
        raise invalid_arg(f"'shared_memory_offset' of tensor '{name}' must be a non-negative integer")
    return region, offset, size


# ---------------------------------------------------------------- request

class InferCodec:
    def __init__(self, dataplane: DataPlane, limits: Limits | None = None) -> None:
        self.dp = dataplane
        self.limits = limits or Limits()
        self._templates: dict[tuple[str, str, int, bytes], templates.HeaderTemplate] = {}
        self._json_templates = JsonTemplates()

    def parse(self, model: str, version: str, headers: dict[str, str], body: Any,
              handle: ModelHandle | None = None) -> ParsedInfer:
        """The InferRequest of a request body to `model` at `version`; `handle`: that model as the router
        resolved it (DataPlane.model), which the raw binary form reads its one input from (resolved here
        when not given)."""
        hlen_text = headers.get("inference-header-content-length")
        if hlen_text is None:  # a JSON body: seen before, or the simple form in one pass, or _parse_doc
            plain_body = type(body) is bytes
            if plain_body:
                seen = self._json_templates.by_model.get((model, version))
                if seen is not None:
                    for pattern in seen:
                        plain = pattern.fill(model, version, body)
                        if plain is not None:
                            return plain
            doc = _load_doc(body)
            plain = parse_plain(model, version, doc, self.limits)
            if plain is not None:
                if plain_body:
                    self._json_templates.learn(model, version, body, doc, plain)
                return plain
            total = len(body) if not isinstance(body, memoryview) else body.nbytes
            return self._parse_doc(model, version, doc, body, -1, total)
        total = len(body) if not isinstance(body, memoryview) else body.nbytes
        t = hlen_text.strip()
        hlen = int(t) if t.isascii() and t.isdigit() and len(t) <= 20 else -1
        if hlen < 0 or hlen > total:
            raise invalid_arg(f"invalid 'Inference-Header-Content-Length' {hlen_text[:32]!r}: must be an "
                              f"integer between 0 and the body size {total}")
        if hlen == 0:
            return self._parse_raw(handle or self.dp.model(model, version), body, total)
        head = body if hlen == total else memoryview(body)[:hlen]
        key = None
        if hlen <= templates.MAX_HEADER:  # a binary request: its header may have been seen before
            key = (model, version, total, bytes(head))
            tpl = self._templates.get(key)
            if tpl is not None:
                parsed = ParsedInfer(*tpl.instantiate(model, version, body, hlen))
                if tpl.shm_outputs:
                    self._hold_regions(parsed, [])
                    self._ask_device_outputs(parsed)
                return parsed
        parsed = self._parse_doc(model, version, _load_doc(head), body, hlen, total)
        if key is not None:
            tpl = templates.HeaderTemplate.of(parsed, body, hlen)
            if tpl is not None:
                if len(self._templates) >= templates.MAX_TEMPLATES:
                    self._templates.clear()
                self._templates[key] = tpl
        return parsed

    def _parse_doc(self, model: str, version: str, doc: dict[str, Any], body: Any, hlen: int,
                   total: int) -> ParsedInfer:
        lim = self.limits
        req = InferRequest(model_name=model, model_version=version)
        rid = doc.get("id", "")
        if not isinstance(rid, str):
            raise invalid_arg("request 'id' must be a string")
        req.id = rid
        parsed = ParsedInfer(req)
        if "parameters" in doc:
            self._request_params(doc, parsed)

        inputs = doc.get("inputs")
        if not isinstance(inputs, list):
            raise invalid_arg("the inference request must hold an 'inputs' array")
        if len(inputs) > lim.max_tensors:
            raise invalid_arg(f"request has {len(inputs)} inputs, at most {lim.max_tensors} are allowed")
        pos = hlen if hlen >= 0 else total
        view: memoryview | None = None
        seen: set[str] = set()
        regions: list[str] | None = None  # the shm regions of its inputs
        for item in inputs:
            name = _name_of(item, "input", lim)
            if name in seen:
                raise invalid_arg(f"input '{name}' is given more than once")
            seen.add(name)
            datatype = item.get("datatype")
            dt, shape, count, nbytes = tensors.shape_info(datatype, item.get("shape"), name)
            params = item.get("parameters")
            if params is None and "data" in item:  # the common case: JSON data, no parameters
                req.inputs.append(Tensor(name, datatype, shape,
                                         tensors.pack_json(dt, shape, count, item["data"], name, lim.max_depth), {}))
                continue
            params = {} if params is None else _params(item, f"input '{name}'")
            has_data = "data" in item
            bsize = params.get("binary_data_size")
            has_shm = "shared_memory_region" in params
            if has_data + (bsize is not None) + has_shm != 1:
                raise invalid_arg(f"input '{name}' must give exactly one of 'data', 'binary_data_size' or "
                                  "'shared_memory_region'")
            extra = ({k: v for k, v in params.items() if k != "binary_data_size" and k not in _SHM_KEYS}
                     if params else {})
            if has_data:
                data: Any = tensors.pack_json(dt, shape, count, item["data"], name, lim.max_depth)
            elif bsize is not None:
                if hlen < 0:
                    raise invalid_arg("must specify valid 'Infer-Header-Content-Length' in request header to "
                                      f"use binary tensor data (input '{name}')")
                if not _is_uint(bsize):
                    raise invalid_arg(f"'binary_data_size' of input '{name}' must be a non-negative "
                                      "integer")
                if bsize > total - pos:
                    raise invalid_arg(f"unexpected size for input '{name}', expecting {bsize} additional "
                                      f"bytes for model '{model}'")
                self._check_size(name, datatype, shape, nbytes, bsize, model)
                if view is None:
                    view = memoryview(body).cast("B")
                data = view[pos:pos + bsize]
                pos += bsize
                if nbytes is None:
                    tensors.check_bytes_framing(data, count, name)
            else:
                region, offset, size = _shm_params(params, name)
                self.dp.shm_check(region, offset, size)  # (Triton checks the window before the size)
                self._check_size(name, datatype, shape, nbytes, size, model)
                data = self.dp.shm_read(region, offset, size, nbytes is not None)  # BYTES: host bytes
                if regions is None:
                    regions = []
                regions.append(region)
                if nbytes is None:
                    tensors.check_bytes_framing(data, count, name)
            req.inputs.append(Tensor(name, datatype, shape, data, extra))
        if hlen >= 0 and pos != total:
            raise invalid_arg(f"unexpected additional input data for model '{model}'")

        outputs = doc.get("outputs")
        if outputs is not None:
            if not isinstance(outputs, list):
                raise invalid_arg("'outputs' must be an array")
            if len(outputs) > lim.max_tensors:
                raise invalid_arg(f"request asks for {len(outputs)} outputs, at most {lim.max_tensors} "
                                  "are allowed")
            for item in outputs:
                self._requested_output(item, parsed)
            if parsed.plans:
                if any(p.shm is not None for p in parsed.plans.values()):
                    self._hold_regions(parsed, regions or [])
                    regions = None
                self._ask_device_outputs(parsed)
        if regions:
            self._hold_regions(parsed, regions)
        return parsed

    def _hold_regions(self, parsed: ParsedInfer, names: list[str]) -> None:
        """Triton's rules for the regions a request names, applied as it is read: each output's window is
        checked, then every region is held until the request is done (memory.client_shm.ShmHold)."""
        for plan in parsed.plans.values():
            if plan.shm is not None:
                region, offset, size = plan.shm
                self.dp.shm_check(region, offset, size)
                names.append(region)
        if names:
            parsed.request.shm_hold = parsed.hold = self.dp.shm_hold(names)

    def _ask_device_outputs(self, parsed: ParsedInfer) -> None:
        """Every output goes to a CUDA region: a GPU model's outputs stay on the device, copied there."""
        if all(p.shm is not None and self.dp.shm_is_cuda(p.shm[0]) for p in parsed.plans.values()):
            parsed.request.device_outputs = True

    @staticmethod
    def _check_size(name: str, datatype: str, shape: list[int], nbytes: int | None, got: int,
                    model: str) -> None:
        if nbytes is not None and nbytes != got:
            raise invalid_arg(f"input byte size mismatch for input '{name}' for model '{model}'. "
                              f"Expected {nbytes}, got {got}")

    def _requested_output(self, item: Any, parsed: ParsedInfer) -> None:
        name = _name_of(item, "output", self.limits)
        params = _params(item, f"output '{name}'")
        plan = OutputPlan()
        binary = params.get("binary_data")
        if binary is not None:
            if not isinstance(binary, bool):
                raise invalid_arg(f"'binary_data' of output '{name}' must be a boolean")
            plan.binary = binary
        cls = params.get("classification")
        if cls is not None and not (type(cls) is int and cls >= 0):
            raise invalid_arg(f"'classification' of output '{name}' must be a non-negative integer")
        if "shared_memory_region" in params:
            if cls is not None:
                raise invalid_arg(CLASSIFICATION_WITH_SHM)
            if binary:  # Triton refuses this pair (`binary_data: false` with a region is accepted)
                raise invalid_arg(f"Output can't set both 'shared_memory_region' and 'binary_data' (output '{name}')")
            plan.shm = _shm_params(params, name)
        if name in parsed.plans:
            return  # asked for again: Triton keeps the first request of an output (its parameters checked)
        parsed.plans[name] = plan
        parsed.request.outputs.append(RequestedOutput(name, dict(params)))

    def _request_params(self, doc: dict[str, Any], parsed: ParsedInfer) -> None:
        params = _params(doc, "the request")
        if len(params) > self.limits.max_parameters:
            raise invalid_arg(f"request has {len(params)} parameters, at most {self.limits.max_parameters} "
                              "are allowed")
        req = parsed.request
        for key, value in params.items():
            if key == "sequence_id":
                if not (_is_uint(value) or isinstance(value, str)):
                    raise invalid_arg("'sequence_id' must be an unsigned integer or a string")
                req.correlation_id = value
            elif key in ("sequence_start", "sequence_end", "binary_data_output"):
                if not isinstance(value, bool):
                    raise invalid_arg(f"parameter '{key}' must be a boolean")
                if key == "binary_data_output":
                    parsed.binary_default = value
                elif value:
                    req.flags |= SEQUENCE_START if key == "sequence_start" else SEQUENCE_END
            elif key in ("priority", "timeout"):
                if not _is_uint(value):
                    raise invalid_arg(f"parameter '{key}' must be an unsigned integer")
                if key == "priority":
                    req.priority = value
                else:
                    req.timeout_us = value
            elif key.startswith("triton_"):
                raise invalid_arg("parameter keys starting with 'triton_' are reserved for Triton usage and "
                                  f"should not be specified (got '{key}')")
            elif isinstance(value, (str, bool, int, float)):
                req.parameters[key] = value
            else:
                raise invalid_arg(f"parameter '{key}' has invalid type. It should be either 'int', 'double', "
                                  "'bool', or 'string'.")

    def _parse_raw(self, handle: ModelHandle, body: Any, total: int) -> ParsedInfer:
        """Header length 0: the body is the one input of a single-input model, batch 1."""
        model = handle.name
        meta = handle.metadata()
        inputs = meta.get("inputs") or []
        if len(inputs) != 1:
            raise invalid_arg(f"raw binary request needs a model with exactly one input; model '{model}' "
                              f"has {len(inputs)}")
        spec = inputs[0]
        name, datatype = spec["name"], spec["datatype"]
        shape = [int(d) for d in spec["shape"]]
        config = handle.config()
        if shape and int(config.get("max_batch_size", 0) or 0) > 0:
            shape[0] = 1
        variable = [i for i, d in enumerate(shape) if d < 0]
        if len(variable) > 1:
            raise invalid_arg(f"raw binary request needs input '{name}' of model '{model}' to have at most "
                              "one variable dimension")
        dt = tensors.datatype_of(datatype, name)
        if dt.itemsize == 0:
            if any(d != 1 for d in shape):
                raise invalid_arg(f"For BYTE datatype raw input '{name}', the model must have input shape [1]")
            data: Any = tensors.pack_bytes([bytes(body)])
        else:
            fixed = dt.itemsize * tensors.element_count([d for d in shape if d >= 0])
            if variable:
                if fixed == 0 or total % fixed:
                    raise invalid_arg(f"raw binary request of {total} bytes does not fit input '{name}' "
                                      f"of model '{model}'")
                shape[variable[0]] = total // fixed
            elif total != fixed:
                raise invalid_arg(f"input byte size mismatch for input '{name}' for model '{model}'. "
                                  f"Expected {fixed}, got {total}")
            data = body
        req = InferRequest(model_name=model, model_version=handle.version)
        req.inputs.append(Tensor(name, datatype, shape, data))
        return ParsedInfer(req, binary_default=True)

    # ------------------------------------------------------------ response

    def _device_output(self, t: Any, plan: OutputPlan | None) -> None:
        if plan is None or plan.shm is None:
            raise internal(f"output '{t.name}' is on a GPU but has no CUDA shared memory region")
        region, offset, size = plan.shm
        nbytes = t.device_ref.nbytes
        if nbytes > size:
            raise invalid_arg(f"shared memory region '{region}' of {size} bytes is too small for "
                              f"output '{t.name}' of {nbytes} bytes")
        self.dp.shm_write(region, offset, t.device_ref)

    def build(self, parsed: ParsedInfer, resp: InferResponse) -> Response:
        entries = []
        blobs: list[Any] = []
        binary_any = False
        blob_bytes = 0
        default = parsed.binary_default
        plans = parsed.plans
        nonfinite = False  # a JSON output holds NaN or an infinity: orjson would write null
        for t in resp.outputs:
            entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
            plan = plans.get(t.name) if plans else None
            if t.device_ref is not None:  # only asked for when every output goes to a CUDA region
                self._device_output(t, plan)
                entries.append(entry)
                continue
            view = t.data if type(t.data) is memoryview else memoryview(t.data)
            nbytes = view.nbytes
            known = _OUTPUT_TYPES.get(t.datatype)
            if known is None:
                raise internal(f"output '{t.name}' has an unknown datatype")
            fixed, code = known
            if fixed:
                for d in t.shape:  # (tensors.element_count, inline: once per output)
                    fixed *= d
            else:
                fixed = nbytes
            if fixed != nbytes:
                raise internal(f"output '{t.name}' holds {nbytes} bytes, its shape {list(t.shape)} of "
                               f"{t.datatype} needs {fixed}")
            if plan is not None and plan.shm is not None:
                region, offset, size = plan.shm
                if nbytes > size:
                    raise invalid_arg(f"shared memory region '{region}' of {size} bytes is too small for "
                                      f"output '{t.name}' of {nbytes} bytes")
                self.dp.shm_write(region, offset, t.data)
            # a listed output is binary only when it asks (Triton ignores binary_data_output for it)
            elif (plan.binary is True) if plan is not None else default:
                entry["parameters"] = {"binary_data_size": nbytes}
                if nbytes:  # (as Triton: only bytes after the JSON make the answer binary)
                    binary_any = True
                    blobs.append(t.data)
                    blob_bytes += nbytes
            else:  # numbers (code): size checked above, a flat list at once
                if code is None:
                    data = tensors.raw_to_json(t.datatype, t.shape, t.data, t.name)
                else:
                    if view.format != "B" or view.ndim != 1:
                        view = view.cast("B")
                    data = view.cast(code).tolist()  # type: ignore[call-overload]
                entry["data"] = data
                if not nonfinite and (t.datatype == "FP32" or t.datatype == "FP64"):
                    nonfinite = json_nonfinite.has_nonfinite(data)
            entries.append(entry)
        doc: dict[str, Any] = {}
        if resp.id:
            doc["id"] = resp.id
        doc["model_name"] = resp.model_name
        version = resp.model_version
        doc["model_version"] = version if type(version) is str else str(version)
        if resp.parameters:
            doc["parameters"] = resp.parameters
        doc["outputs"] = entries
        try:
            head = json_nonfinite.dumps(doc) if nonfinite else orjson.dumps(doc)
        except (TypeError, ValueError) as exc:
            raise internal(f"response could not be serialized: {exc}") from None
        if binary_any:
            headers = {"Inference-Header-Content-Length": str(len(head))}
            if blobs and blob_bytes > _JOIN_BYTES:  # large: the buffers are written as they are
                return Response(200, [head, *blobs], "application/octet-stream", headers)
            return Response(200, b"".join([head, *blobs]) if blobs else head, "application/octet-stream", headers)
        return Response(200, head)
