"""The OpenAI port's HTTP/1.1 connection: http_api's, with the refusals the connection itself makes (a
body over --http-max-input-size, malformed HTTP, timeouts) in the OpenAI error shape instead of KServe's."""

from __future__ import annotations

from inferd.supervisor.http_api.connection import HttpConnection

from . import errors


class OpenAIConnection(HttpConnection):
    def _fatal(self, status: int, message: str) -> None:
        transport = self._transport
        if status and not self.closed and transport is not None:
            # answers already written or coalesced go first, then this one; the base then closes without
            # writing its own (status 0)
            self._coalescer.release(transport)
            transport.write(errors.fatal_bytes(status, message, self._server.max_body,
                                               self._headers.get("content-length")))
        super()._fatal(0, message)
