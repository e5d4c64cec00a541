"""POST /v1/embeddings: float lists, or base64 of little-endian float32 (`encoding_format`).

Two kinds of model serve it:
- Triton's vLLM convention (a model with input `embedding_request`): that input is the JSON
  {"input": <text or token ids>, "pooling_params": {"dimensions": [d]}}, the vector comes back as JSON in
  `text_output`, token counts in `num_input_tokens` when the model returns them;
- beyond Triton, any model with one text (BYTES) input and one floating-point output: the text goes in,
  the output's values are the vector (`dimensions` must then be the vector's length).
A list of strings makes one request per string, run together, answered in order.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
import orjson
from inferd.supervisor.core.model_handle import ModelHandle
from inferd.supervisor.http_api.request_cycle import Response
from inferd.supervisor.inference.types import InferRequest

from . import outputs, schema
from .catalog import ModelInfo
from .context import Api
from .errors import bad_request
from .streaming import Stream

_R = TypeVar("_R")

VLLM_INPUT = "embedding_request"
MAX_IN_FLIGHT = 32  # a list of strings runs one request per string, this many at a time
_FLOAT_TYPES = ("TYPE_FP16", "TYPE_FP32", "TYPE_FP64")


def _generic_io(info: ModelInfo) -> tuple[str, str] | None:
    """(text input, vector output) of a model with one BYTES input and one float output."""
    config = info.config
    required = [i for i in config.get("input") or [] if not i.get("optional")]
    outs = config.get("output") or []
    if (len(required) == 1 and required[0].get("data_type") in ("TYPE_STRING", "TYPE_BYTES")
            and len(outs) == 1 and outs[0].get("data_type") in _FLOAT_TYPES):
        return str(required[0]["name"]), str(outs[0]["name"])
    return None


class Embeddings:
    def __init__(self, api: Api) -> None:
        self.api = api

    async def __call__(self, req: Any) -> Response:
        body = schema.check(schema.load(req.body), schema.EMBEDDING)
        info, handle, _, _ = self.api.catalog.resolve(body["model"], self.api.options.lora_separator)
        value = body["input"]
        items = value if isinstance(value, list) and value and isinstance(value[0], str) else [value]
        io = None
        if not info.inputs.has(VLLM_INPUT):
            io = _generic_io(info)
            if io is None:
                raise bad_request(f"model '{info.name}' cannot create embeddings: it needs the input "
                                  f"'{VLLM_INPUT}' (Triton's vLLM embedding models), or one text (BYTES) input and "
                                  "one floating-point output", param="model")

        def run(item: Any) -> Awaitable[tuple[list[float], int | None]]:
            if io is None:
                return self._vllm(info, handle, item, body.get("dimensions"))
            return self._generic(info, handle, io, item, body.get("dimensions"))

        results = await _each(run, items)
        prompt_tokens = None if any(n is None for _, n in results) else sum(n for _, n in results)  # type: ignore[misc]
        base64_out = body.get("encoding_format") == "base64"
        data = [{"object": "embedding", "index": i, "embedding": _encode(vector, base64_out)}
                for i, (vector, _) in enumerate(results)]
        usage = None if prompt_tokens is None else {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        if usage is None:
            usage = await self._count(info, items)
        return Response(200, orjson.dumps({"object": "list", "data": data, "model": body["model"], "usage": usage}))

    async def _vllm(self, info: ModelInfo, handle: ModelHandle, item: Any,
                    dimensions: int | None) -> tuple[list[float], int | None]:
        doc = {"input": item, "pooling_params": {"dimensions": [dimensions]} if dimensions is not None else {}}
        tensors = [info.inputs.tensor(VLLM_INPUT, [orjson.dumps(doc).decode()])]
        for flag in ("return_num_input_tokens", "return_num_output_tokens"):
            if info.inputs.has(flag):
                tensors.append(info.inputs.tensor(flag, [True]))
        resp = await self._one(InferRequest(model_name=info.name, inputs=tensors, model=handle))
        vector = outputs.json_output(resp, "text_output")
        if not isinstance(vector, list):
            raise bad_request(f"model '{info.name}' answered no embedding (its 'text_output' is not a JSON list)")
        return [float(v) for v in vector], outputs.count(resp, "num_input_tokens")

    async def _generic(self, info: ModelInfo, handle: ModelHandle, io: tuple[str, str], item: Any,
                       dimensions: int | None) -> tuple[list[float], int | None]:
        if not isinstance(item, str):
            raise bad_request(f"model '{info.name}' takes text: token ids cannot be embedded by it", param="input")
        name, output = io
        resp = await self._one(InferRequest(model_name=info.name, inputs=[info.inputs.tensor(name, [item])],
                                            model=handle))
        vector = outputs.float_vector(resp, output)
        if dimensions is not None and dimensions != len(vector):
            raise bad_request(f"model '{info.name}' makes vectors of {len(vector)} dimensions, not {dimensions}",
                              param="dimensions")
        return vector, outputs.count(resp, "num_input_tokens")

    async def _one(self, request: InferRequest) -> Any:
        stream = Stream(self.api.dp, request)
        try:
            resp = await stream.first()
            while resp is not None and not resp.outputs:  # a decoupled model's flag-only final
                resp = await stream.next()
        finally:
            await stream.close()
        if resp is None:
            raise bad_request("the model answered nothing")
        return resp

    async def _count(self, info: ModelInfo, items: list[Any]) -> dict[str, int] | None:
        """Usage from the tokenizer where the model does not count; None without one."""
        ids = sum(len(item) for item in items if isinstance(item, list))
        texts = [item for item in items if not isinstance(item, list)]
        counted = await self.api.catalog.count(info, texts) if texts else 0
        if counted is None:
            return None
        n = ids + counted
        return {"prompt_tokens": n, "total_tokens": n}


async def _each(run: Callable[[Any], Awaitable[_R]], items: list[Any]) -> list[_R]:
    """run(item) for every item, in order, at most MAX_IN_FLIGHT at a time (a client's list of a million
    strings must not start a million requests at once); the first failure cancels the others."""
    results: list[Any] = [None] * len(items)
    todo = iter(enumerate(items))

    async def lane() -> None:
        for i, item in todo:
            results[i] = await run(item)

    lanes = [asyncio.ensure_future(lane()) for _ in range(min(MAX_IN_FLIGHT, len(items)))]
    try:
        await asyncio.gather(*lanes)
    except BaseException:
        for task in lanes:
            task.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
        raise
    return results


def _encode(vector: list[float], as_base64: bool) -> Any:
    if not as_base64:
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
