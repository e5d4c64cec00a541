"""tritonserver's gRPC connection flags as each gRPC server receives them: grpcio's channel arguments,
the native server's connection Lifetime, and the TLS context / credentials (tls.py)."""

from __future__ import annotations

import ssl
from pathlib import Path

from inferd.supervisor.config import GrpcKeepalive
from inferd.supervisor.flags import parse_args
from inferd.supervisor.grpc_api import tls
from inferd.supervisor.grpc_api.grpcio_server import channel_options
from inferd.supervisor.grpc_api.http2.lifetime import Lifetime
from inferd.supervisor.grpc_api.native_server import lifetime

TLS = Path(__file__).resolve().parents[2] / "fixtures" / "tls"


def _config(*flags: str):
    return parse_args(["--model-repository", str(TLS), *flags])


def test_grpcio_channel_arguments() -> None:
    plain = dict(channel_options(1024))
    assert plain["grpc.so_reuseport"] == 0  # grpcio's default of 1 would let a second server share the port
    assert not any(key.startswith(("grpc.keepalive", "grpc.http2", "grpc.max_connection")) for key in plain)
    assert dict(channel_options(1024, reuse_port=True))["grpc.so_reuseport"] == 1
    defaults = dict(channel_options(1024, keepalive=GrpcKeepalive()))
    assert defaults["grpc.keepalive_time_ms"] == 7_200_000
    assert defaults["grpc.keepalive_timeout_ms"] == 20_000
    assert defaults["grpc.keepalive_permit_without_calls"] == 0
    assert defaults["grpc.http2.max_pings_without_data"] == 2
    assert defaults["grpc.http2.min_ping_interval_without_data_ms"] == 300_000
    assert defaults["grpc.http2.max_ping_strikes"] == 2
    assert "grpc.max_connection_age_ms" not in defaults  # 0: no limit, grpc's own default
    assert "grpc.max_connection_age_grace_ms" not in defaults
    config = _config(
        "--grpc-keepalive-time", "1000", "--grpc-keepalive-timeout", "500",
        "--grpc-keepalive-permit-without-calls", "true", "--grpc-http2-max-pings-without-data", "0",
        "--grpc-http2-min-recv-ping-interval-without-data", "100", "--grpc-http2-max-ping-strikes", "7",
        "--grpc-max-connection-age", "60000", "--grpc-max-connection-age-grace", "5000",
    )
    given = dict(channel_options(1024, keepalive=config.grpc_keepalive))
    assert given["grpc.keepalive_time_ms"] == 1000 and given["grpc.keepalive_timeout_ms"] == 500
    assert given["grpc.keepalive_permit_without_calls"] == 1
    assert given["grpc.http2.max_pings_without_data"] == 0
    assert given["grpc.http2.min_ping_interval_without_data_ms"] == 100
    assert given["grpc.http2.max_ping_strikes"] == 7
    assert given["grpc.max_connection_age_ms"] == 60000 and given["grpc.max_connection_age_grace_ms"] == 5000


def test_native_lifetime() -> None:
    assert lifetime(GrpcKeepalive()) == Lifetime(ping_interval=7200.0, ping_timeout=20.0)
    assert lifetime(GrpcKeepalive(time_ms=0, max_connection_age_ms=1500)) == Lifetime(
        ping_interval=None, ping_timeout=20.0, max_age=1.5, max_age_grace=None
    )
    assert lifetime(
        GrpcKeepalive(time_ms=100, timeout_ms=50, permit_without_calls=True, max_connection_age_ms=1000,
                      max_connection_age_grace_ms=250)
    ) == Lifetime(ping_interval=0.1, ping_timeout=0.05, ping_idle=True, max_age=1.0, max_age_grace=0.25)


def test_tls_context_and_credentials() -> None:
    assert tls.server_context(_config()) is None and tls.server_credentials(_config()) is None
    keys = ["--grpc-server-cert", str(TLS / "server.pem"), "--grpc-server-key", str(TLS / "server.key")]
    one_way = _config("--grpc-use-ssl", "true", *keys)
    ctx = tls.server_context(one_way)
    assert ctx is not None and ctx.verify_mode == ssl.CERT_NONE
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.server_credentials(one_way) is not None
    mutual = _config("--grpc-use-ssl-mutual", "true", "--grpc-root-cert", str(TLS / "ca.pem"), *keys)
    assert tls.enabled(mutual) and tls.mutual(mutual)
    ctx = tls.server_context(mutual)
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED
    assert [cert["subject"] for cert in ctx.get_ca_certs()] == [((("commonName", "inferd test CA"),),)]
    assert tls.server_credentials(mutual) is not None
