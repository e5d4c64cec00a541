"""Strict readiness (issue 18 item 6), as Triton 2.51 answers it (checked against the real Triton with
INFERD_E2E_TARGET=triton): with --strict-readiness (the default) the server is not ready while a model
of the repository failed to load: /v2/health/ready is 400, gRPC ServerReady false, live stays true.
A failure holds until the model loads; unloading the failed model does not clear it, unloading a
model that was ready does not count. The grpc.health.v1 Check answers NOT_SERVING whenever ServerReady
is false."""

from __future__ import annotations

import grpc as grpcio
import pytest
import tritonclient.grpc as grpcclient

GOOD_MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''


def index_state(server, name: str) -> str:
    http = server.http_client()
    try:
        rows = [e for e in http.get_model_repository_index() if e["name"] == name]
    finally:
        http.close()
    return rows[0].get("state", "") if rows else ""


SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"  # grpc.health.v1 HealthCheckResponse.status


def health(server) -> tuple[int, int, bool]:
    """(HTTP live, HTTP ready, gRPC ServerReady); the grpc.health.v1 Check must agree with ready."""
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        ready = grpc.is_server_ready(client_timeout=5)
    finally:
        grpc.close()
    with grpcio.insecure_channel(server.grpc_url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10)
    http_ready = server.get("/v2/health/ready")[0]
    assert check == (SERVING if ready else NOT_SERVING), (check, ready)
    return server.get("/v2/health/live")[0], http_ready, ready


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "not-strict"])
def test_failed_model_at_start(server_factory, strict):
    server = server_factory(["identity_fp32", "init_fail"], wait_ready=["identity_fp32"],
                            extra_args=["--exit-on-error=false", f"--strict-readiness={str(strict).lower()}"])
    server.wait_until(lambda: index_state(server, "init_fail") == "UNAVAILABLE", 30, "init_fail UNAVAILABLE")
    assert server.model_ready("identity_fp32")
    assert health(server) == ((200, 400, False) if strict else (200, 200, True))


def test_failed_load_in_explicit_mode_then_unload_then_fixed(server_factory):
    server = server_factory(["identity_fp32", "init_fail"], control_mode="explicit",
                            load_models=["identity_fp32"])
    server.wait_until(lambda: health(server) == (200, 200, True), 30, "server ready")
    http = server.http_client()
    try:
        with pytest.raises(Exception, match="init_fail"):
            http.load_model("init_fail")
        assert health(server) == (200, 400, False)
        http.unload_model("init_fail")  # the failure stays (Triton keeps its reason in the index)
        assert health(server) == (200, 400, False)
        assert index_state(server, "init_fail") == "UNAVAILABLE"
        (server.repo / "init_fail" / "1" / "model.py").write_text(GOOD_MODEL)
        http.load_model("init_fail")
        assert health(server) == (200, 200, True)
        http.unload_model("init_fail")  # an unloaded model does not hold readiness
        http.unload_model("identity_fp32")
        # Triton unloads in the background: wait until both are unloaded, then ready again
        server.wait_until(lambda: {index_state(server, n) for n in ("init_fail", "identity_fp32")}
                          == {"UNAVAILABLE"} and health(server) == (200, 200, True), 30, "ready after unloads")
    finally:
        http.close()


def test_failed_model_removed_in_poll_mode(server_factory):
    """Triton 2.51 keeps the failure after the model left the repository: still not ready."""
    import shutil

    server = server_factory(["identity_fp32", "init_fail"], control_mode="poll", wait_ready=["identity_fp32"],
                            extra_args=["--exit-on-error=false", "--repository-poll-secs=1"])
    server.wait_until(lambda: index_state(server, "init_fail") == "UNAVAILABLE", 30, "init_fail UNAVAILABLE")
    assert health(server) == (200, 400, False)
    shutil.rmtree(server.repo / "init_fail")
    # a model added with the removal: once it is ready, a poll has seen both changes
    shutil.copytree(server.repo / "identity_fp32", server.repo / "identity_later")
    config = server.repo / "identity_later" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "identity_fp32"', 'name: "identity_later"'))
    server.wait_until(lambda: server.model_ready("identity_later"), 30, "identity_later loaded by a poll")
    assert health(server) == (200, 400, False)
