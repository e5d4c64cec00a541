"""gRPC over TLS (tritonserver's --grpc-use-ssl, --grpc-use-ssl-mutual, --grpc-server-cert,
--grpc-server-key, --grpc-root-cert), for both gRPC servers: an `ssl.SSLContext` for inferd's own
HTTP/2 server, `grpc.ssl_server_credentials` for grpcio's.

The PEM files are read once at start-up; a certificate renewed on disk takes effect at the next start.
"""

from __future__ import annotations

import ssl
from typing import Any


def enabled(config: Any) -> bool:
    return bool(getattr(config, "grpc_use_ssl", False) or getattr(config, "grpc_use_ssl_mutual", False))


def mutual(config: Any) -> bool:
    return bool(getattr(config, "grpc_use_ssl_mutual", False))


def server_context(config: Any) -> ssl.SSLContext | None:
    """The native server's TLS context (TLS 1.2+, ALPN "h2"), or None without --grpc-use-ssl.
    With --grpc-use-ssl-mutual a client must present a certificate signed by --grpc-root-cert."""
    if not enabled(config):
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(config.grpc_server_cert, config.grpc_server_key)
    ctx.set_alpn_protocols(["h2"])  # gRPC clients insist on it
    if mutual(config):
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=config.grpc_root_cert)
    return ctx


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def server_credentials(config: Any) -> Any:
    """grpcio's server credentials, or None without --grpc-use-ssl."""
    if not enabled(config):
        return None
    import grpc

    root = _read(config.grpc_root_cert) if mutual(config) else None
    return grpc.ssl_server_credentials(
        [(_read(config.grpc_server_key), _read(config.grpc_server_cert))],
        root_certificates=root,
        require_client_auth=mutual(config),
    )


def describe(config: Any) -> str:
    """For the start-up log."""
    if mutual(config):
        return (f"TLS with client certificates (certificate {config.grpc_server_cert}, "
                f"client CA {config.grpc_root_cert})")
    return f"TLS (certificate {config.grpc_server_cert})"
