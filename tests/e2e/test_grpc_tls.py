"""tritonserver's gRPC connection flags on both gRPC servers (--grpc-server native | grpcio): TLS
(--grpc-use-ssl, --grpc-use-ssl-mutual with client certificates), --reuse-grpc-port, and the maximum
connection age (--grpc-max-connection-age / -grace), with unmodified tritonclient against real servers.

The certificates are static files in tests/fixtures/tls (see its README for how they were made).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.inferd_only  # the flags are Triton's, but these tests start servers with inferd's options

TLS = Path(__file__).resolve().parents[1] / "fixtures" / "tls"
CA, SERVER_CERT, SERVER_KEY = str(TLS / "ca.pem"), str(TLS / "server.pem"), str(TLS / "server.key")
CLIENT_CERT, CLIENT_KEY = str(TLS / "client.pem"), str(TLS / "client.key")
IMPLS = ["native", "grpcio"]
CALL_TIMEOUT = 30.0  # per call: a busy 2-core machine may be slow, but never this slow


def _tls_args(impl: str, mutual: bool = False) -> list[str]:
    args = ["--grpc-server", impl, "--grpc-server-cert", SERVER_CERT, "--grpc-server-key", SERVER_KEY]
    if mutual:
        return [*args, "--grpc-use-ssl-mutual", "true", "--grpc-root-cert", CA]
    return [*args, "--grpc-use-ssl", "true"]


def _inputs(module, values: np.ndarray) -> list:
    inp = module.InferInput("INPUT0", list(values.shape), "FP32")
    inp.set_data_from_numpy(values)
    return [inp]


def _check_calls(client) -> None:
    """Live, ready and a correct identity_fp32 infer through a synchronous tritonclient.grpc client."""
    assert client.is_server_live(client_timeout=CALL_TIMEOUT)
    assert client.is_server_ready(client_timeout=CALL_TIMEOUT)
    assert client.is_model_ready("identity_fp32", client_timeout=CALL_TIMEOUT)
    data = np.arange(1000, dtype=np.float32)
    result = client.infer("identity_fp32", _inputs(grpcclient, data), client_timeout=CALL_TIMEOUT)
    assert np.array_equal(result.as_numpy("OUTPUT0"), data)


def _refused(client) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        client.is_server_live(client_timeout=CALL_TIMEOUT)
    assert err.value.status() == "StatusCode.UNAVAILABLE", err.value
    return err.value


def _tls_client(url: str, **kw) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url, ssl=True, root_certificates=CA, **kw)


@pytest.fixture(scope="module", params=IMPLS)
def tls_server(request, module_server_factory):
    return module_server_factory(["identity_fp32"], inferd_args=_tls_args(request.param))


@pytest.fixture(scope="module", params=IMPLS)
def mutual_server(request, module_server_factory):
    return module_server_factory(["identity_fp32"], inferd_args=_tls_args(request.param, mutual=True))


# ---- TLS ----
def test_tls_client_is_served(tls_server):
    assert "Started GRPCInferenceService at 127.0.0.1:%d" % tls_server.grpc_port in tls_server.log()
    with _tls_client(tls_server.grpc_url) as client:  # the certificate names IP 127.0.0.1 ...
        _check_calls(client)
        big = np.random.default_rng(0).random(4 * 1024 * 1024, dtype=np.float32)  # 16 MiB each way
        result = client.infer("identity_fp32", _inputs(grpcclient, big), client_timeout=CALL_TIMEOUT)
        assert np.array_equal(result.as_numpy("OUTPUT0"), big)
    with _tls_client(f"localhost:{tls_server.grpc_port}") as client:  # ... and DNS localhost
        assert client.is_server_live(client_timeout=CALL_TIMEOUT)


def test_tls_aio_client_is_served(tls_server):
    import tritonclient.grpc.aio as aioclient

    async def calls() -> None:
        async with aioclient.InferenceServerClient(tls_server.grpc_url, ssl=True, root_certificates=CA) as client:
            assert await client.is_server_live(client_timeout=CALL_TIMEOUT)
            assert await client.is_model_ready("identity_fp32", client_timeout=CALL_TIMEOUT)
            data = np.linspace(-1, 1, 257, dtype=np.float32)
            results = await asyncio.gather(*(
                client.infer("identity_fp32", _inputs(aioclient, data * i), client_timeout=CALL_TIMEOUT)
                for i in range(8)))
            for i, result in enumerate(results):
                assert np.array_equal(result.as_numpy("OUTPUT0"), data * i)

    asyncio.run(calls())


def test_plaintext_client_on_the_tls_port_fails(tls_server):
    with grpcclient.InferenceServerClient(tls_server.grpc_url) as client:
        _refused(client)
    with _tls_client(tls_server.grpc_url) as client:  # and the server goes on serving
        assert client.is_server_live(client_timeout=CALL_TIMEOUT)


def test_tls_client_distrusting_the_server_fails(tls_server):
    # its own certificate is no CA of the server's: the handshake fails on the client's side
    with grpcclient.InferenceServerClient(tls_server.grpc_url, ssl=True, root_certificates=CLIENT_CERT) as client:
        _refused(client)


def test_mutual_tls_needs_a_client_certificate(mutual_server):
    with _tls_client(mutual_server.grpc_url) as client:
        _refused(client)
    with _tls_client(mutual_server.grpc_url, private_key=CLIENT_KEY, certificate_chain=CLIENT_CERT) as client:
        _check_calls(client)


# ---- --reuse-grpc-port ----
def _stats_count(server) -> int:
    stats = server.http_client().get_inference_statistics("identity_fp32")
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


@pytest.mark.parametrize("impl", IMPLS)
def test_reuse_grpc_port_lets_servers_share_the_port(server_factory, harness, impl):
    port = harness.free_ports(1)[0]
    shared = ["--grpc-server", impl, "--grpc-port", str(port), "--reuse-grpc-port", "true"]
    first = server_factory(["identity_fp32"], inferd_args=shared)
    second = server_factory(["identity_fp32"], inferd_args=shared)
    for server in (first, second):
        assert f"Started GRPCInferenceService at 127.0.0.1:{port}" in server.log()
    # the kernel spreads new connections over both: 24 connections all landing on one is 2**-23
    # (a local subchannel pool: a channel of its own opens a connection of its own)
    for _ in range(24):
        own = [("grpc.use_local_subchannel_pool", 1)]
        with grpcclient.InferenceServerClient(f"127.0.0.1:{port}", channel_args=own) as client:
            _check_calls(client)
    assert _stats_count(first) > 0 and _stats_count(second) > 0
    assert _stats_count(first) + _stats_count(second) == 24

    # a server without the flag cannot join them
    argv = list(first.argv)
    argv[argv.index("--http-port") + 1], argv[argv.index("--metrics-port") + 1] = map(str, harness.free_ports(2))
    at = len(argv) - 1 - argv[::-1].index("--reuse-grpc-port")
    argv[at + 1] = "false"
    third = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
    assert third.returncode != 0
    assert f"gRPC server cannot bind 127.0.0.1:{port}" in third.stdout, third.stdout[-3000:]
    assert first.alive() and second.alive()


# ---- --grpc-max-connection-age ----
def _sleep(client, seconds: float):
    return client.infer("sleep", _inputs(grpcclient, np.array([seconds], dtype=np.float32)),
                        client_timeout=CALL_TIMEOUT)


@pytest.mark.parametrize("impl", IMPLS)
def test_max_connection_age_and_grace(server_factory, impl):
    age = ["--grpc-max-connection-age", "300", "--grpc-max-connection-age-grace", "1000"]
    server = server_factory(["identity_fp32", "sleep"], inferd_args=["--grpc-server", impl, *age])
    with server.grpc_client() as client:
        # a call outliving the connection's age plus grace is cut off with the connection
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as err:
            _sleep(client, 4)
        assert err.value.status() == "StatusCode.UNAVAILABLE", err.value
        assert time.monotonic() - started < 3.5
        # meanwhile and afterwards the client's new calls go over new connections
        deadline = time.monotonic() + 1.5  # a few connection ages
        while time.monotonic() < deadline:
            _check_calls(client)


@pytest.mark.parametrize("impl", IMPLS)
def test_max_connection_age_without_grace_lets_calls_finish(server_factory, impl):
    age = ["--grpc-max-connection-age", "200"]  # the grace defaults to 0: no limit
    server = server_factory(["identity_fp32", "sleep"], inferd_args=["--grpc-server", impl, *age])
    with server.grpc_client() as client:
        assert _sleep(client, 1.5).as_numpy("OUTPUT0")[0] == pytest.approx(1.5)
        _check_calls(client)
