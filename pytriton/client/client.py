"""ModelClient, AsyncioModelClient, FuturesModelClient and DecoupledModelClient (PyTriton's client API)
on tritonclient, for HTTP (`http://host:8000`, the default scheme) and gRPC (`grpc://host:8001`).

`infer_sample` sends one sample (a batch axis is added for batching models and removed from the
outputs); `infer_batch` sends a batch as it is. Inputs go positionally (in the model's input order) or
by name. tritonclient's errors become PyTriton's client exceptions.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional
from urllib.parse import urlparse

import numpy as np

from .exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientInvalidUrlError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientModelUnavailableError,
    PyTritonClientQueueFullError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from .model_config import TritonModelConfig

DEFAULT_INIT_TIMEOUT_S = 300.0
DEFAULT_INFERENCE_TIMEOUT_S = 60.0
_PORTS = {"http": 8000, "grpc": 8001}


def parse_url(url: str) -> tuple[str, str]:
    """(scheme, "host:port") of `url`; http and its default port when left out."""
    text = url if "://" in url else "http://" + url
    parsed = urlparse(text)
    scheme = parsed.scheme.lower()
    if scheme not in _PORTS or not parsed.hostname:
        raise PyTritonClientInvalidUrlError("invalid url %r: use http://host[:port] or grpc://host[:port]" % url)
    return scheme, "%s:%d" % (parsed.hostname, parsed.port or _PORTS[scheme])


def _lib(scheme: str, aio: bool = False) -> Any:
    if scheme == "grpc":
        if aio:
            import tritonclient.grpc.aio as grpc_aio

            return grpc_aio
        import tritonclient.grpc as grpc_lib

        return grpc_lib
    if aio:
        import tritonclient.http.aio as http_aio

        return http_aio
    import tritonclient.http as http_lib

    return http_lib


def _translate(exc: BaseException, model: str) -> Exception:
    """tritonclient's (and the network's) errors as PyTriton's."""
    text = str(exc)
    status = str(getattr(exc, "status", lambda: "")() or "") if callable(getattr(exc, "status", None)) else ""
    lowered = (status + " " + text).lower()
    if isinstance(exc, TimeoutError) or "deadline" in lowered or "timed out" in lowered or "timeout" in lowered:
        return PyTritonClientTimeoutError("inference on model '%s' timed out: %s" % (model, text))
    if "unavailable" in lowered and ("model" in lowered or "not ready" in lowered) or "unknown model" in lowered:
        return PyTritonClientModelUnavailableError("model '%s' is unavailable: %s" % (model, text))
    if isinstance(exc, (ConnectionError, OSError)):
        return PyTritonClientModelUnavailableError("cannot reach the server for model '%s': %s" % (model, text))
    return PyTritonClientInferenceServerError("error from the server for model '%s': %s" % (model, text))


def _named(config: TritonModelConfig, inputs: tuple, named_inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    if inputs and named_inputs:
        raise PyTritonClientValueError("give inputs either positionally or by name, not both")
    if inputs:
        if len(inputs) > len(config.inputs):
            raise PyTritonClientValueError("model '%s' has %d inputs, %d given"
                                           % (config.model_name, len(config.inputs), len(inputs)))
        named_inputs = {spec.name: value for spec, value in zip(config.inputs, inputs)}
    if not named_inputs:
        raise PyTritonClientValueError("no inputs given")
    return {name: np.asarray(value) for name, value in named_inputs.items()}


def _datatype(array: np.ndarray) -> str:
    if array.dtype.kind in "OSU":
        return "BYTES"
    from tritonclient.utils import np_to_triton_dtype

    found = np_to_triton_dtype(array.dtype)
    if found is None:
        raise PyTritonClientValueError("unsupported input dtype %s" % array.dtype)
    return str(found)


def _prepare(lib: Any, config: TritonModelConfig, arrays: dict[str, np.ndarray], scheme: str
             ) -> tuple[list[Any], list[Any]]:
    infer_inputs = []
    for name, array in arrays.items():
        if array.dtype.kind == "U":
            array = np.char.encode(array, "utf-8")
        item = lib.InferInput(name, list(array.shape), _datatype(array))
        item.set_data_from_numpy(array)
        infer_inputs.append(item)
    outputs = [lib.InferRequestedOutput(spec.name) for spec in config.outputs]
    return infer_inputs, outputs


def _results(result: Any, config: TritonModelConfig) -> dict[str, np.ndarray]:
    out = {}
    for spec in config.outputs:
        value = result.as_numpy(spec.name)
        if value is not None:
            out[spec.name] = value
    return out


def _unbatch(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: value[0] if value.ndim else value for name, value in outputs.items()}


def _config_from(raw: Any) -> TritonModelConfig:
    doc = raw.get("config", raw) if isinstance(raw, dict) else raw
    return TritonModelConfig.from_json(doc)


class BaseModelClient:
    _aio = False

    def __init__(self, url: str, model_name: str, model_version: Optional[str] = None, *, lazy_init: bool = True,
                 init_timeout_s: Optional[float] = None, inference_timeout_s: Optional[float] = None,
                 model_config: Optional[TritonModelConfig] = None, ensure_model_is_ready: bool = True,
                 access_token: Optional[str] = None) -> None:
        self._scheme, self._address = parse_url(url)
        self._url = url
        self._model_name = model_name
        self._model_version = str(model_version) if model_version is not None else ""
        self._init_timeout_s = DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else float(init_timeout_s)
        self._inference_timeout_s = (DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None
                                     else float(inference_timeout_s))
        self._ensure_ready = ensure_model_is_ready
        self._model_config = model_config
        self._headers = {"authorization": "Bearer %s" % access_token} if access_token else None
        self._lib = _lib(self._scheme, self._aio)
        self._closed = False
        self._ids = itertools.count(0)
        self._client = self._make_client()

    def _make_client(self) -> Any:
        lib = self._lib
        if self._scheme == "grpc":
            return lib.InferenceServerClient(self._address)
        if self._aio:
            return lib.InferenceServerClient(self._address, conn_timeout=self._inference_timeout_s)
        return lib.InferenceServerClient(self._address, connection_timeout=self._inference_timeout_s,
                                         network_timeout=self._inference_timeout_s)

    def get_lib(self) -> Any:
        """The tritonclient module in use (tritonclient.http, tritonclient.grpc, or their aio)."""
        return self._lib

    def _check_open(self) -> None:
        if self._closed:
            raise PyTritonClientClosedError("the client is closed")

    def _infer_kwargs(self, parameters: Optional[dict[str, Any]], headers: Optional[dict[str, Any]]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model_version": self._model_version, "request_id": str(next(self._ids))}
        if parameters:
            kwargs["parameters"] = parameters
        merged = {**(self._headers or {}), **(headers or {})}
        if merged:
            kwargs["headers"] = {k: str(v) for k, v in merged.items()}
        if self._scheme == "grpc":
            kwargs["client_timeout"] = self._inference_timeout_s
        return kwargs


class ModelClient(BaseModelClient):
    """Synchronous client: `infer_sample`, `infer_batch`, `model_config`, `wait_for_model`."""

    def __init__(self, url: str, model_name: str, model_version: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(url, model_name, model_version, **kwargs)
        self._ready = False
        if not kwargs.get("lazy_init", True):
            self._init()

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._client.close()
            except Exception:  # noqa: S110 - closing anyway
                pass

    def _init(self) -> None:
        if self._ensure_ready and not self._ready:
            self.wait_for_model(self._init_timeout_s)
        self._ready = True

    def wait_for_server(self, timeout_s: float) -> None:
        self._wait(timeout_s, lambda: self._client.is_server_ready(), "the server")

    def wait_for_model(self, timeout_s: float) -> None:
        """Block until the server and the model are ready (PyTritonClientTimeoutError after `timeout_s`)."""
        self._check_open()
        self._wait(timeout_s, lambda: self._client.is_server_ready() and self._client.is_model_ready(
            self._model_name, self._model_version), "model '%s'" % self._model_name)

    def _wait(self, timeout_s: float, probe: Any, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        pause = 0.01
        while True:
            try:
                if probe():
                    return
            except Exception:  # noqa: S110 - not up yet
                pass
            if time.monotonic() + pause > deadline:
                raise PyTritonClientTimeoutError("%s is not ready after %g s" % (what, timeout_s))
            threading.Event().wait(pause)
            pause = min(pause * 2, 0.5)

    @property
    def model_config(self) -> TritonModelConfig:
        self._check_open()
        if self._model_config is None:
            self._init()
            try:
                if self._scheme == "grpc":
                    raw = self._client.get_model_config(self._model_name, self._model_version, as_json=True)
                else:
                    raw = self._client.get_model_config(self._model_name, self._model_version)
            except Exception as exc:
                raise _translate(exc, self._model_name) from None
            self._model_config = _config_from(raw)
        return self._model_config

    def is_batching_supported(self) -> bool:
        return self.model_config.batching

    def load_model(self, config: Optional[str] = None, files: Optional[dict] = None) -> None:
        """Ask the server to load (or reload) this model (explicit model control)."""
        self._check_open()
        try:
            self._client.load_model(self._model_name, config=config, files=files)
        except Exception as exc:
            raise _translate(exc, self._model_name) from None
        self._model_config = None

    def unload_model(self) -> None:
        self._check_open()
        try:
            self._client.unload_model(self._model_name)
        except Exception as exc:
            raise _translate(exc, self._model_name) from None

    def infer_sample(self, *inputs: Any, parameters: Optional[dict[str, Any]] = None,
                     headers: Optional[dict[str, Any]] = None, **named_inputs: Any) -> dict[str, np.ndarray]:
        config = self.model_config
        arrays = _named(config, inputs, named_inputs)
        if config.batching:
            arrays = {k: v[np.newaxis, ...] for k, v in arrays.items()}
            return _unbatch(self._infer(config, arrays, parameters, headers))
        return self._infer(config, arrays, parameters, headers)

    def infer_batch(self, *inputs: Any, parameters: Optional[dict[str, Any]] = None,
                    headers: Optional[dict[str, Any]] = None, **named_inputs: Any) -> dict[str, np.ndarray]:
        config = self.model_config
        if not config.batching:
            raise PyTritonClientModelDoesntSupportBatchingError(
                "model '%s' does not support batching (max_batch_size 0)" % self._model_name)
        return self._infer(config, _named(config, inputs, named_inputs), parameters, headers)

    def _infer(self, config: TritonModelConfig, arrays: dict[str, np.ndarray], parameters: Any,
               headers: Any) -> dict[str, np.ndarray]:
        self._check_open()
        if config.decoupled:
            raise PyTritonClientValueError("model '%s' is decoupled: use DecoupledModelClient" % self._model_name)
        infer_inputs, outputs = _prepare(self._lib, config, arrays, self._scheme)
        try:
            result = self._client.infer(self._model_name, infer_inputs, outputs=outputs,
                                        **self._infer_kwargs(parameters, headers))
        except Exception as exc:
            raise _translate(exc, self._model_name) from None
        return _results(result, config)


class DecoupledModelClient(ModelClient):
    """gRPC streaming client for decoupled models: `infer_sample` / `infer_batch` yield each response."""

    def __init__(self, url: str, model_name: str, model_version: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(url, model_name, model_version, **kwargs)
        if self._scheme != "grpc":
            raise PyTritonClientInvalidUrlError("DecoupledModelClient works over gRPC only (grpc://host:port)")

    def _infer(self, config: TritonModelConfig, arrays: dict[str, np.ndarray], parameters: Any,
               headers: Any) -> Any:
        raise AssertionError("unused")  # pragma: no cover

    def infer_sample(self, *inputs: Any, parameters: Optional[dict[str, Any]] = None,  # type: ignore[override]
                     headers: Optional[dict[str, Any]] = None, **named_inputs: Any) -> Iterator[dict[str, np.ndarray]]:
        config = self.model_config
        arrays = _named(config, inputs, named_inputs)
        if config.batching:
            arrays = {k: v[np.newaxis, ...] for k, v in arrays.items()}
            return (_unbatch(r) for r in self._stream(config, arrays, parameters, headers))
        return self._stream(config, arrays, parameters, headers)

    def infer_batch(self, *inputs: Any, parameters: Optional[dict[str, Any]] = None,  # type: ignore[override]
                    headers: Optional[dict[str, Any]] = None, **named_inputs: Any) -> Iterator[dict[str, np.ndarray]]:
        config = self.model_config
        if not config.batching:
            raise PyTritonClientModelDoesntSupportBatchingError(
                "model '%s' does not support batching (max_batch_size 0)" % self._model_name)
        return self._stream(config, _named(config, inputs, named_inputs), parameters, headers)

    def _stream(self, config: TritonModelConfig, arrays: dict[str, np.ndarray], parameters: Any,
                headers: Any) -> Iterator[dict[str, np.ndarray]]:
        self._check_open()
        replies: queue.Queue[Any] = queue.Queue()
        infer_inputs, outputs = _prepare(self._lib, config, arrays, self._scheme)
        kwargs = self._infer_kwargs(parameters, headers)
        stream_kwargs = {"headers": kwargs.pop("headers")} if "headers" in kwargs else {}
        kwargs.pop("client_timeout", None)
        self._client.start_stream(callback=lambda result, error: replies.put((result, error)), **stream_kwargs)
        try:
            self._client.async_stream_infer(self._model_name, infer_inputs, outputs=outputs,
                                            enable_empty_final_response=True, **kwargs)
            while True:
                try:
                    result, error = replies.get(timeout=self._inference_timeout_s)
                except queue.Empty:
                    raise PyTritonClientTimeoutError("no response from model '%s' within %g s"
                                                     % (self._model_name, self._inference_timeout_s)) from None
                if error is not None:
                    raise _translate(error, self._model_name)
                response = result.get_response()
                final = response.parameters.get("triton_final_response")
                if response.outputs:
                    yield _results(result, config)
                if final is not None and final.bool_param:
                    return
        finally:
            self._client.stop_stream(cancel_requests=True)


class AsyncioModelClient(BaseModelClient):
    """asyncio client: `await infer_sample(...)`, `await infer_batch(...)`, `await model_config`."""

    _aio = True

    async def __aenter__(self) -> AsyncioModelClient:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._client.close()

    async def wait_for_model(self, timeout_s: float) -> None:
        self._check_open()
        deadline = time.monotonic() + timeout_s
        pause = 0.01
        while True:
            try:
                if await self._client.is_server_ready() and await self._client.is_model_ready(
                        self._model_name, self._model_version):
                    return
            except Exception:  # noqa: S110 - not up yet
                pass
            if time.monotonic() + pause > deadline:
                raise PyTritonClientTimeoutError("model '%s' is not ready after %g s" % (self._model_name, timeout_s))
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)

    @property
    async def model_config(self) -> TritonModelConfig:
        self._check_open()
        if self._model_config is None:
            if self._ensure_ready:
                await self.wait_for_model(self._init_timeout_s)
            try:
                if self._scheme == "grpc":
                    raw = await self._client.get_model_config(self._model_name, self._model_version, as_json=True)
                else:
                    raw = await self._client.get_model_config(self._model_name, self._model_version)
            except Exception as exc:
                raise _translate(exc, self._model_name) from None
            self._model_config = _config_from(raw)
        return self._model_config

    async def infer_sample(self, *inputs: Any, parameters: Optional[dict[str, Any]] = None,
                           headers: Optional[dict[str, Any]] = None, **named_inputs: Any) -> dict[str, np.ndarray]:
        config = await self.model_config
        arrays = _named(config, inputs, named_inputs)
        if config.batching:
            arrays = {k: v[np.newaxis, ...] for k, v in arrays.items()}
            return _unbatch(await self._infer(config, arrays, parameters, headers))
        return await self._infer(config, arrays, parameters, headers)

    async def infer_batch(self, *inputs: Any, parameters: Optional[dict[str, Any]] = None,
                          headers: Optional[dict[str, Any]] = None, **named_inputs: Any) -> dict[str, np.ndarray]:
        config = await self.model_config
        if not config.batching:
            raise PyTritonClientModelDoesntSupportBatchingError(
                "model '%s' does not support batching (max_batch_size 0)" % self._model_name)
        return await self._infer(config, _named(config, inputs, named_inputs), parameters, headers)

    async def _infer(self, config: TritonModelConfig, arrays: dict[str, np.ndarray], parameters: Any,
                     headers: Any) -> dict[str, np.ndarray]:
        self._check_open()
        infer_inputs, outputs = _prepare(self._lib, config, arrays, self._scheme)
        kwargs = self._infer_kwargs(parameters, headers)
        if self._scheme == "http":
            kwargs["timeout"] = int(self._inference_timeout_s * 1e6)
        try:
            result = await asyncio.wait_for(
                self._client.infer(self._model_name, infer_inputs, outputs=outputs, **kwargs),
                self._inference_timeout_s + 1.0)
        except asyncio.TimeoutError:
            raise PyTritonClientTimeoutError("inference on model '%s' timed out after %g s"
                                             % (self._model_name, self._inference_timeout_s)) from None
        except Exception as exc:
            raise _translate(exc, self._model_name) from None
        return _results(result, config)

    async def infer_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[dict[str, np.ndarray]]:
        raise PyTritonClientValueError("use DecoupledModelClient for decoupled models")
        yield {}  # pragma: no cover


class AsyncioDecoupledModelClient(AsyncioModelClient):
    """asyncio streaming client for decoupled models (gRPC): `async for out in client.infer_sample(...)`."""

    def __init__(self, url: str, model_name: str, model_version: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(url, model_name, model_version, **kwargs)
        if self._scheme != "grpc":
            raise PyTritonClientInvalidUrlError("AsyncioDecoupledModelClient works over gRPC only (grpc://host:port)")

    async def infer_sample(self, *inputs: Any, parameters: Optional[dict[str, Any]] = None,  # type: ignore[override]
                           headers: Optional[dict[str, Any]] = None,
                           **named_inputs: Any) -> AsyncIterator[dict[str, np.ndarray]]:
        config = await self.model_config
        arrays = _named(config, inputs, named_inputs)
        if config.batching:
            arrays = {k: v[np.newaxis, ...] for k, v in arrays.items()}
        async for out in self._stream(config, arrays, parameters, headers):
            yield _unbatch(out) if config.batching else out

    async def infer_batch(self, *inputs: Any, parameters: Optional[dict[str, Any]] = None,  # type: ignore[override]
                          headers: Optional[dict[str, Any]] = None,
                          **named_inputs: Any) -> AsyncIterator[dict[str, np.ndarray]]:
        config = await self.model_config
        if not config.batching:
            raise PyTritonClientModelDoesntSupportBatchingError(
                "model '%s' does not support batching (max_batch_size 0)" % self._model_name)
        async for out in self._stream(config, _named(config, inputs, named_inputs), parameters, headers):
            yield out

    async def _stream(self, config: TritonModelConfig, arrays: dict[str, np.ndarray], parameters: Any,
                      headers: Any) -> AsyncIterator[dict[str, np.ndarray]]:
        """One ModelStreamInfer call with Triton's empty final response switched on (tritonclient's aio
        stream refuses that reserved parameter, so the request is built here)."""
        import grpc
        from tritonclient.grpc import InferResult, service_pb2_grpc
        from tritonclient.grpc._utils import _get_inference_request

        self._check_open()
        infer_inputs, outputs = _prepare(self._lib, config, arrays, self._scheme)
        request = _get_inference_request(model_name=self._model_name, inputs=infer_inputs,
                                         model_version=self._model_version, request_id=str(next(self._ids)),
                                         outputs=outputs, sequence_id=0, sequence_start=False, sequence_end=False,
                                         priority=0, timeout=None, parameters=parameters)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        metadata = tuple((k.lower(), str(v)) for k, v in {**(self._headers or {}), **(headers or {})}.items())

        async def requests() -> AsyncIterator[Any]:
            yield request

        async with grpc.aio.insecure_channel(self._address) as channel:
            call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
                requests(), metadata=metadata or None)
            try:
                while True:
                    try:
                        reply = await asyncio.wait_for(call.read(), self._inference_timeout_s)
                    except asyncio.TimeoutError:
                        raise PyTritonClientTimeoutError("no response from model '%s' within %g s"
                                                         % (self._model_name, self._inference_timeout_s)) from None
                    if reply is grpc.aio.EOF:
                        return
                    if reply.error_message:
                        raise _translate(RuntimeError(reply.error_message), self._model_name)
                    response = reply.infer_response
                    if response.outputs:
                        yield _results(InferResult(response), config)
                    final = response.parameters.get("triton_final_response")
                    if final is not None and final.bool_param:
                        return
            except grpc.aio.AioRpcError as exc:
                raise _translate(RuntimeError("%s: %s" % (exc.code(), exc.details())), self._model_name) from None
            finally:
                call.cancel()


class FuturesModelClient:
    """A pool of threads, each with its own ModelClient; every call returns a concurrent.futures.Future."""

    def __init__(self, url: str, model_name: str, model_version: Optional[str] = None, *,
                 max_workers: Optional[int] = None, max_queue_size: Optional[int] = None,
                 non_blocking: bool = False, init_timeout_s: Optional[float] = None,
                 inference_timeout_s: Optional[float] = None) -> None:
        parse_url(url)
        self._args = (url, model_name, model_version)
        self._kwargs = {"init_timeout_s": init_timeout_s, "inference_timeout_s": inference_timeout_s}
        self._executor = ThreadPoolExecutor(max_workers=max_workers or 128, thread_name_prefix="inferd-futures")
        self._local = threading.local()
        self._clients: list[ModelClient] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_queue_size) if max_queue_size else None
        self._non_blocking = non_blocking
        self._closed = False

    def __enter__(self) -> FuturesModelClient:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def _client(self) -> ModelClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = ModelClient(*self._args, **self._kwargs)  # type: ignore[arg-type]
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _submit(self, call: Any) -> Future:
        if self._closed:
            raise PyTritonClientClosedError("the client is closed")
        if self._slots is not None and not self._slots.acquire(blocking=not self._non_blocking):
            raise PyTritonClientQueueFullError("the request queue is full")

        def run() -> Any:
            try:
                return call(self._client())
            finally:
                if self._slots is not None:
                    self._slots.release()

        return self._executor.submit(run)

    def wait_for_model(self, timeout_s: float) -> Future:
        return self._submit(lambda c: c.wait_for_model(timeout_s))

    def model_config(self) -> Future:
        return self._submit(lambda c: c.model_config)

    def infer_sample(self, *inputs: Any, parameters: Optional[dict[str, Any]] = None,
                     headers: Optional[dict[str, Any]] = None, **named_inputs: Any) -> Future:
        return self._submit(lambda c: c.infer_sample(*inputs, parameters=parameters, headers=headers, **named_inputs))

    def infer_batch(self, *inputs: Any, parameters: Optional[dict[str, Any]] = None,
                    headers: Optional[dict[str, Any]] = None, **named_inputs: Any) -> Future:
        return self._submit(lambda c: c.infer_batch(*inputs, parameters=parameters, headers=headers, **named_inputs))

    def close(self, wait: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=wait)
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
