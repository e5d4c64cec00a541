"""The supervisor's side of BLS: requests and model-control calls that Python models make from their
workers (worker/bls.py), on each worker's `<identity>/bls` socket.

A request becomes an ordinary InferRequest through the data plane, so the callee's scheduler,
batching, statistics and response cache apply as for a client. Inputs arrive as frames or as regions
the calling worker owns (mapped here read-only, by name); outputs above the inline limit go back in
pool leases that the caller holds until its arrays are garbage collected (BlsRelease), or until it
exits. Timeouts given by the caller are enforced here. A call that could never be served — a model
calling itself while every one of its instances is itself waiting on a BLS call — fails at once
instead of hanging.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Sequence
from typing import Any

from inferd.worker.wire import messages as m
from inferd.worker.wire import shm
from inferd.worker.wire.errors import ErrorCode, InferdError

from ..core.dataplane_impl import FINAL_FLAG, ServerDataPlane
from ..inference.types import InferRequest, InferResponse, RequestedOutput, Tensor
from ..memory.device_refs import TABLE, DeviceRef, device_key

log = logging.getLogger("inferd.bls")

BLS_SUFFIX = "/bls"
_MAX_MAPPED = 64  # caller regions kept mapped (they are reused by the caller, so few distinct names)


class _Caller:
    """What the supervisor keeps per calling worker."""

    def __init__(self) -> None:
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.leases: dict[int, Any] = {}
        self.regions: dict[str, shm.Region] = {}
        self.waiting = 0  # BLS calls in flight: while > 0 this instance cannot take other work

    def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        for lease in self.leases.values():
            lease.release()
        self.leases.clear()
        for region in self.regions.values():
            region.close()
        self.regions.clear()


class BlsService:
    def __init__(self, dataplane: ServerDataPlane, channel: Any, pool: Any) -> None:
        self.dataplane = dataplane
        self.channel = channel
        self.pool = pool
        self._callers: dict[str, _Caller] = {}
        self._lease_ids = itertools.count(1)
        channel.route_suffix(BLS_SUFFIX, self._on_message, self._on_gone)

    # ---- routing ----
    def _on_message(self, identity: str, frames: list[Any]) -> None:
        try:
            message, data = m.decode(frames)
        except m.ProtocolError as exc:
            log.warning("malformed BLS message from worker %s: %s", identity, exc)
            return
        worker = identity.split("/", 1)[0]  # replies go to the socket that asked; state is per worker
        caller = self._callers.get(worker)
        if caller is None:
            caller = self._callers[worker] = _Caller()
        kind = type(message)
        if kind is m.BlsRequest:
            call_id = message.call_id
            task = asyncio.get_running_loop().create_task(self._serve(identity, caller, message, data, worker))
            caller.tasks[call_id] = task
            task.add_done_callback(lambda _t: caller.tasks.pop(call_id, None))
        elif kind is m.BlsCancel:
            running = caller.tasks.get(message.call_id)
            if running is not None:
                running.cancel()
        elif kind is m.BlsRelease:
            for lease_id in message.lease_ids:
                lease = caller.leases.pop(lease_id, None)
                if lease is not None:
                    lease.release()
        elif kind is m.ModelControl:
            asyncio.get_running_loop().create_task(self._control(identity, message, data))
        else:
            log.warning("unexpected %s on the BLS socket of worker %s", kind.__name__, identity)

    def _on_gone(self, identity: str) -> None:
        """The worker left (stopped or died): its calls stop, its leases and mappings go."""
        caller = self._callers.pop(identity, None)
        if caller is not None:
            caller.close()  # its regions are unlinked by WorkerProcess when it is reaped

    def _send(self, identity: str, message: Any, frames: Sequence[Any] = ()) -> None:
        try:
            self.channel.send(identity, m.encode(message, frames))
        except InferdError:
            pass  # the caller is gone; _on_gone cleans up

    # ---- inference ----
    async def _serve(self, identity: str, caller: _Caller, msg: m.BlsRequest, data: Sequence[Any],
                     worker: str = "") -> None:
        caller.waiting += 1
        try:
            request = self._request(caller, msg, data, worker)
            # python_backend asks first, too (the callee's is_ready() included, in the current Triton)
            if not await self.dataplane.model_ready_async(msg.model_name, msg.model_version):
                raise InferdError(ErrorCode.INTERNAL, "Failed for execute the inference request. Model '%s' is "
                                  "not ready." % msg.model_name)
            self._check_deadlock(identity, request)
            if msg.decoupled:
                await self._stream(identity, caller, msg, request)
            else:
                response = await self._with_timeout(self.dataplane.infer(request), msg.timeout_us)
                self._reply(identity, caller, msg.call_id, response, True)
        except asyncio.CancelledError:
            self._reply(identity, caller, msg.call_id,
                        InferdError(ErrorCode.CANCELLED, "BLS request was cancelled"), True)
        except InferdError as exc:
            self._reply(identity, caller, msg.call_id, exc, True)
        except Exception as exc:  # a bug on our side: answer so the model does not wait forever
            log.exception("BLS request failed", extra={"model": msg.model_name, "request_id": msg.request_id})
            self._reply(identity, caller, msg.call_id, InferdError(ErrorCode.INTERNAL, str(exc)), True)
        finally:
            caller.waiting -= 1

    async def _stream(self, identity: str, caller: _Caller, msg: m.BlsRequest, request: InferRequest) -> None:
        async def pump() -> bool:
            final_sent = False
            stream = self.dataplane.stream_infer(request)
            try:
                async for item in stream:
                    if isinstance(item, InferdError):
                        self._reply(identity, caller, msg.call_id, item, False)
                        continue
                    final = bool(item.parameters.pop(FINAL_FLAG, True))
                    self._reply(identity, caller, msg.call_id, item, final)
                    final_sent = final_sent or final
            finally:
                await stream.aclose()  # type: ignore[attr-defined]  # an async generator
            return final_sent

        if not await self._with_timeout(pump(), msg.timeout_us):
            # the stream ended without a flagged final (a flag-only FINAL): end the call
            self._send(identity, m.BlsResponse(msg.call_id, final=True))

    @staticmethod
    async def _with_timeout(awaitable: Any, timeout_us: int) -> Any:
        if not timeout_us:
            return await awaitable
        try:
            return await asyncio.wait_for(awaitable, timeout_us / 1e6)
        except asyncio.TimeoutError:
            raise InferdError(ErrorCode.UNAVAILABLE, "Request timeout expired") from None

    def _request(self, caller: _Caller, msg: m.BlsRequest, data: Sequence[Any], worker: str = "") -> InferRequest:
        inputs = []
        for ref in msg.inputs:
            if ref.loc == "cuda":
                inputs.append(self._device_input(ref, worker))
                continue
            if ref.loc == "frame":
                if not 0 <= ref.frame < len(data):
                    raise InferdError(ErrorCode.INVALID_ARG, "BLS input '%s' refers to a missing frame" % ref.name)
                frame = data[ref.frame]
                inputs.append(Tensor(ref.name, ref.datatype, list(ref.shape), memoryview(frame)))
            elif ref.loc == "shm":
                inputs.append(Tensor(ref.name, ref.datatype, list(ref.shape), self._map(caller, ref),
                                     shm_ref=(ref.region, ref.offset)))
            else:
                raise InferdError(ErrorCode.INVALID_ARG, "BLS input '%s' has an unknown location" % ref.name)
        try:
            params = json.loads(msg.parameters) if msg.parameters else {}
        except ValueError:
            raise InferdError(ErrorCode.INVALID_ARG, "BLS request parameters are not JSON") from None
        return InferRequest(
            model_name=msg.model_name, model_version=msg.model_version, id=msg.request_id, inputs=inputs,
            outputs=[RequestedOutput(name) for name in msg.requested_outputs],
            parameters=params if isinstance(params, dict) else {}, correlation_id=msg.correlation_id,
            flags=msg.flags, timeout_us=msg.timeout_us,
            device_outputs=bool(msg.device_outputs),  # a caller that can open device outputs gets them so
            trace_parent=self.dataplane.trace_of(msg.trace))

    @staticmethod
    def _device_input(ref: m.TensorRef, worker: str) -> Tensor:
        """A BLS input in device memory: the caller's own (it holds it until the call ends; the
        supervisor only lends the callee a share) or a device tensor it was given (a live share)."""
        if not (type(ref.region) is str and len(ref.region) == 128 and type(ref.offset) is int and ref.offset >= 0
                and type(ref.nbytes) is int and ref.nbytes >= 0 and type(ref.device) is int and ref.device >= 0):
            raise InferdError(ErrorCode.INVALID_ARG, "BLS input '%s' has a bad device reference" % ref.name)
        key = device_key(ref.region, ref.offset)
        if ref.owner:
            share = TABLE.find(ref.owner, key)
            if share is None:
                raise InferdError(ErrorCode.UNAVAILABLE, "BLS input '%s' refers to device memory of instance '%s' "
                                  "that is no longer held" % (ref.name, ref.owner))
        else:
            share = TABLE.register(worker, key, "BLS caller %s" % worker, notify=False)
        return Tensor(ref.name, ref.datatype, list(ref.shape), b"",
                      device_ref=DeviceRef(share, ref.region, ref.offset, ref.nbytes, ref.device))

    def _map(self, caller: _Caller, ref: m.TensorRef) -> memoryview:
        if not shm.valid_name(ref.region):
            raise InferdError(ErrorCode.INVALID_ARG, "invalid shared memory region for BLS input '%s'" % ref.name)
        region = caller.regions.get(ref.region)
        if region is None:
            if len(caller.regions) >= _MAX_MAPPED:
                caller.regions.pop(next(iter(caller.regions))).close()
            region = caller.regions[ref.region] = shm.attach(ref.region, readonly=True)
        if ref.offset < 0 or ref.nbytes < 0 or ref.offset + ref.nbytes > region.size:
            raise InferdError(ErrorCode.INVALID_ARG, "BLS input '%s' lies outside its region" % ref.name)
        return region.buf[ref.offset: ref.offset + ref.nbytes]

    def _check_deadlock(self, identity: str, request: InferRequest) -> None:
        """A call into the caller's own model with every instance waiting on BLS can never run."""
        worker_identity = identity.split("/", 1)[0]
        target = self.dataplane.resolve_ready(request.model_name, request.model_version)
        identities = [inst.worker.identity for inst in target.instances if inst.worker is not None]
        if worker_identity not in identities:
            return
        busy = sum(1 for ident in identities if (c := self._callers.get(ident)) is not None and c.waiting > 0)
        if busy >= len(identities):
            raise InferdError(
                ErrorCode.UNAVAILABLE,
                "BLS request to model '%s' would deadlock: all %d of its instances are waiting on BLS calls, "
                "including the caller" % (target.name, len(identities)))

    def _reply(self, identity: str, caller: _Caller, call_id: int, item: InferResponse | InferdError,
               final: bool) -> None:
        if isinstance(item, InferdError):
            self._send(identity, m.BlsResponse(call_id, error=m.WireError(int(item.code), item.message), final=final))
            return
        refs: list[m.TensorRef] = []
        leases: list[int] = []
        frames: list[Any] = []
        try:
            for t in item.outputs:
                if t.device_ref is not None:  # stays on its GPU: the caller opens it by IPC handle
                    device = t.device_ref
                    share = device.share.share()  # raises (naming the producer) if its memory is gone
                    lease_id = next(self._lease_ids)
                    caller.leases[lease_id] = share
                    refs.append(m.TensorRef(t.name, t.datatype, list(t.shape), "cuda", -1, device.region,
                                            device.offset, device.nbytes, device.device, share.label))
                    leases.append(lease_id)
                    continue
                view = t.data if isinstance(t.data, memoryview) else memoryview(t.data)
                nbytes = view.nbytes
                if nbytes <= m.INLINE_MAX_BYTES:
                    refs.append(m.TensorRef(t.name, t.datatype, list(t.shape), "frame", len(frames), "", 0, nbytes))
                    leases.append(0)
                    frames.append(view)
                    continue
                if t.shm_ref is not None:  # already in shared memory (the callee's output region): by name
                    lease_id = next(self._lease_ids)
                    caller.leases[lease_id] = _Held(view)  # the region stays the callee's until released
                    refs.append(m.TensorRef(t.name, t.datatype, list(t.shape), "shm", -1, t.shm_ref[0],
                                            t.shm_ref[1], nbytes))
                    leases.append(lease_id)
                    continue
                lease = self.pool.lease(nbytes)
                lease.write(view)
                lease_id = next(self._lease_ids)
                caller.leases[lease_id] = lease
                refs.append(m.TensorRef(t.name, t.datatype, list(t.shape), "shm", -1, lease.name, lease.offset,
                                        nbytes))
                leases.append(lease_id)
        except InferdError as exc:
            for lease_id in leases:
                if lease_id:
                    caller.leases.pop(lease_id).release()
            self._send(identity, m.BlsResponse(call_id, error=m.WireError(int(exc.code), exc.message), final=final))
            return
        params = {k: v for k, v in item.parameters.items() if k != FINAL_FLAG}
        self._send(identity, m.BlsResponse(call_id, refs, leases, None, params, final), frames)

    # ---- model control ----
    async def _control(self, identity: str, msg: m.ModelControl, data: Sequence[Any]) -> None:
        result = m.ModelControlResult(msg.call_id)
        try:
            if msg.op == "ready":
                result.ready = await self.dataplane.model_ready_async(msg.model_name, msg.model_version)
            elif msg.op == "load":
                params: dict[str, Any] = {}
                if msg.config:
                    params["config"] = msg.config
                for i, name in enumerate(msg.files):
                    if i >= len(data):
                        raise InferdError(ErrorCode.INVALID_ARG, "load_model file '%s' has no data" % name)
                    params[name if name.startswith("file:") else "file:" + name] = bytes(data[i])
                await self.dataplane.load_model(msg.model_name, params)
            elif msg.op == "unload":
                await self.dataplane.unload_model(msg.model_name, msg.unload_dependents)
            else:
                raise InferdError(ErrorCode.INVALID_ARG, "unknown model control operation '%s'" % msg.op)
        except InferdError as exc:
            result.error = m.WireError(int(exc.code), exc.message)
        except Exception as exc:
            log.exception("model control from a model failed")
            result.error = m.WireError(int(ErrorCode.INTERNAL), str(exc))
        self._send(identity, result)


class _Held:
    """A view of a worker's output region lent to a BLS caller: while held, the region is not given
    back to its worker (supervisor/instances/outputs.py releases it once the last view is gone)."""

    __slots__ = ("view",)

    def __init__(self, view: memoryview) -> None:
        self.view: memoryview | None = view

    def release(self) -> None:
        self.view = None
