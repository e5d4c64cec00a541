"""The OpenAI port's route table and the endpoints that are not inference: the models list, model
load/unload (explicit model-control mode), /metrics and /health/ready.

Restricted APIs (--openai-restricted-api): each route belongs to API groups (inference: completions, chat
and, as in Triton's code, embeddings; embedding: embeddings; model-repository: the models endpoints;
metrics; health); a request must carry the header of every restricted group of its route, the value
compared in constant time (access.Restriction), else 401 (Triton's OpenAI frontend status and body).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import orjson
from inferd.supervisor import header_rules as access
from inferd.supervisor.http_api.request_cycle import HandlerResult, Request, Response
from inferd.supervisor.metrics.text_format import CONTENT_TYPE as METRICS_CONTENT_TYPE
from inferd.worker.wire.errors import InferdError

from . import errors
from .chat import Chat
from .completions import Completions
from .context import Api
from .embeddings import Embeddings

OWNED_BY = "Triton Inference Server"  # what Triton's frontend says; clients may compare it
_INFERENCE = ("inference",)
_EMBEDDING = ("inference", "embedding")
_REPOSITORY = ("model-repository",)

Route = tuple[tuple[str, ...], str, Callable[..., Any], tuple[Any, ...]]


class Router:
    """The handler of the OpenAI port's HttpServer."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.completions = Completions(api)
        self.chat = Chat(api)
        self.embeddings = Embeddings(api)
        self.restricted = {group: access.Restriction(key, value, "") for group, (key, value)
                           in api.options.restricted.items()}
        self._control = asyncio.Lock()  # loads and unloads one at a time, as Triton's frontend makes them

    def __call__(self, req: Request) -> HandlerResult:
        route = self._route(req.path)
        if route is None:
            return errors.OpenAIError(404, f"no route {req.path}", code="not_found").response()
        groups, method, fn, args = route
        for group in groups:
            rule = self.restricted.get(group)
            if rule is not None and not rule.allows(req.headers.get(rule.header)):
                return errors.OpenAIError(
                    401, f"This API is restricted, expecting header '{self.api.options.restricted[group][0]}' "
                    "with valid value", type="authentication_error", code="invalid_auth").response()
        if req.method != method:
            return errors.OpenAIError(405, f"{req.path} answers {method} only", code="method_not_allowed").response()
        try:
            result = fn(req, *args)
        except Exception as exc:
            return errors.response(exc)
        if isinstance(result, Response):
            return result
        return _guarded(result)

    def _route(self, path: str) -> Route | None:
        if path == "/v1/chat/completions":
            return _INFERENCE, "POST", self.chat, ()
        if path == "/v1/completions":
            return _INFERENCE, "POST", self.completions, ()
        if path == "/v1/embeddings":
            return _EMBEDDING, "POST", self.embeddings, ()
        if path == "/v1/models":
            return _REPOSITORY, "GET", self._models, ()
        if path.startswith("/v1/models/"):
            rest = unquote(path[len("/v1/models/"):])
            for action in ("load", "unload"):
                if rest.endswith("/" + action):
                    return _REPOSITORY, "POST", self._manage, (rest[: -len(action) - 1], action)
            return _REPOSITORY, "GET", self._model, (rest,)
        if path == "/metrics":
            return ("metrics",), "GET", self._metrics, ()
        if path == "/health/ready":
            return ("health",), "GET", self._ready, ()
        return None

    # ---- models ----
    def _card(self, name: str) -> dict[str, Any]:
        info = self.api.catalog.get(name)
        return {"id": name, "object": "model", "created": info.created, "owned_by": OWNED_BY}

    def _models(self, req: Request) -> Response:
        data = []
        sep = self.api.options.lora_separator
        for name in self.api.catalog.ready_names():
            try:
                card = self._card(name)
            except errors.OpenAIError:
                continue  # gone since it was listed
            data.append(card)
            if sep:
                data.extend({**card, "id": f"{name}{sep}{lora}"} for lora in self.api.catalog.get(name).loras)
        return Response(200, orjson.dumps({"object": "list", "data": data}))

    def _model(self, req: Request, name: str) -> Response:
        info = self.api.catalog.resolve(name, self.api.options.lora_separator).info
        card = self._card(info.name)
        card["id"] = name
        return Response(200, orjson.dumps(card))

    async def _manage(self, req: Request, name: str, action: str) -> Response:
        """Load or unload, answered once done (Triton's frontend: the model's card, or a status)."""
        if self.api.control_mode != "explicit":
            raise errors.bad_request("Model load/unload requires --model-control-mode=explicit")
        if not name or "/" in name:  # no such route, as Triton's router answers it
            raise errors.OpenAIError(404, f"no route {req.path}", code="not_found")
        if name in (".", "..") or not name.strip():
            raise errors.bad_request(f"Invalid model name: {name!r}", param="model")
        async with self._control:
            loaded = name in self.api.catalog.ready_names()
            if action == "load":
                if loaded:
                    raise errors.bad_request(f"Model '{name}' is already loaded", param="model")
                await self._control_call(self.api.dp.load_model(name, {}), name, action)
                return Response(200, orjson.dumps(self._card(name)))
            if not loaded:
                raise errors.bad_request(f"Unknown model: {name}", param="model", code="model_not_found")
            await self._control_call(self.api.dp.unload_model(name), name, action)
            self.api.catalog.forget(name)
            return Response(200, orjson.dumps({"status": "success", "model": name}))

    @staticmethod
    async def _control_call(op: Awaitable[None], name: str, action: str) -> None:
        try:
            await op
        except InferdError as exc:
            err = errors.from_inferd(exc)
            raise errors.OpenAIError(err.status, f"Failed to {action} model '{name}': {exc.message}",
                                     type=err.type) from None

    # ---- observability ----
    def _metrics(self, req: Request) -> Response:
        return Response(200, self.api.dp.metrics_text(), METRICS_CONTENT_TYPE)

    def _ready(self, req: Request) -> Response:
        if self.api.dp.ready():
            return Response(200, b"", None)
        raise errors.bad_request("Attached inference engine is not ready for inference requests.")


async def _guarded(pending: Awaitable[Response]) -> Response:
    try:
        return await pending
    except Exception as exc:
        return errors.response(exc)
