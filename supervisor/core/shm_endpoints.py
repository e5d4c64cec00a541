"""The shared-memory endpoints of the data plane (register, unregister, status; reads and writes of a
region for the frontends) over the client shm registry, memory/client_shm.py. With client shm disabled (the
default, as Triton 2.70+): register and unregister are refused with Triton's 501; status answers as for a
server with no region; a tensor naming a region finds none."""

from __future__ import annotations

from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

CLIENT_SHM_DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."


class ShmEndpoints:
    shm: Any  # memory.client_shm.ClientShm, or None when client shared memory is disabled

    def _client_shm(self) -> Any:
        if self.shm is None:
            raise InferdError(ErrorCode.UNSUPPORTED, CLIENT_SHM_DISABLED)
        return self.shm

    def shm_check_allowed(self) -> None:
        self._client_shm()

    def shm_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        if self.shm is None:
            if name:
                raise InferdError(ErrorCode.NOT_FOUND, "Unable to find %s shared memory region: '%s'"
                                  % ("cuda" if kind == "cuda" else "system", name))
            return []
        return self.shm.status(kind, name)

    def shm_register(self, kind: str, name: str, **fields: Any) -> None:
        self._client_shm().register(kind, name, **fields)

    def shm_unregister(self, kind: str, name: str = "") -> None:
        self._client_shm().unregister(kind, name)

    def shm_is_cuda(self, region: str) -> bool:
        return self.shm is not None and region in self.shm.cuda.regions

    def shm_check(self, region: str, offset: int, byte_size: int) -> None:
        if self.shm is None:
            raise _no_region(region)
        self.shm.check(region, offset, byte_size)

    def shm_hold(self, names: Any) -> Any:
        return None if self.shm is None else self.shm.hold(names)

    def shm_read(self, region: str, offset: int, byte_size: int, device_ok: bool = False) -> Any:
        if self.shm is None:
            raise _no_region(region)
        return self.shm.read(region, offset, byte_size, device_ok)

    def shm_write(self, region: str, offset: int, data: Any) -> None:
        if self.shm is None:
            raise _no_region(region)
        self.shm.write(region, offset, data)


def _no_region(region: str) -> InferdError:
    return InferdError(ErrorCode.NOT_FOUND, "Unable to find shared memory region: '%s'" % region)
