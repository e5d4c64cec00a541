"""Model load/unload on the OpenAI port (explicit model-control mode) and restricted APIs: the cases of
Triton's test_model_management.py and test_openai_restricted_apis.py that apply, against one explicit-mode
server with --openai-restricted-api on every group but one, and a none-mode server without restrictions."""

from __future__ import annotations

import concurrent.futures
import http.client

import httpx
import openai_servers
import pytest

MODEL, OTHER = "llm_trtllm_counts", "identity"
REPO_KEY = {"model-key": "model-value"}
INFER_KEY = {"infer-key": "infer-value"}
EMBED_KEY = {"embed-key": "embed-value"}


@pytest.fixture(scope="module")
def srv(module_server_factory, harness):
    return openai_servers.start(
        module_server_factory, harness, {MODEL: MODEL, OTHER: OTHER, "text_embed": "text_embed"},
        tokenizer_for=(MODEL,), control_mode="explicit", load_models=["text_embed"],
        extra=["--openai-restricted-api", "model-repository", "model-key", "model-value",
               "--openai-restricted-api", "inference infer-key infer-value",
               "--openai-restricted-api", "embedding,metrics", "embed-key", "embed-value"])


def names(srv):
    r = httpx.get(srv.base + "/v1/models", headers=REPO_KEY)
    assert r.status_code == 200
    return [m["id"] for m in r.json()["data"]]


def manage(srv, name, action, headers=REPO_KEY):
    return httpx.post(f"{srv.base}/v1/models/{name}/{action}", headers=headers, timeout=60)


def complete(srv, headers=INFER_KEY):
    return httpx.post(srv.base + "/v1/completions", json={"model": MODEL, "prompt": "COUNT:3", "max_tokens": 10},
                      headers=headers, timeout=30)


def test_load_complete_unload_reload(srv):
    assert names(srv) == ["text_embed"]
    assert complete(srv).status_code == 404
    r = manage(srv, MODEL, "load")
    assert r.status_code == 200, r.text
    card = r.json()
    assert card["id"] == MODEL and card["object"] == "model" and card["created"] > 0
    assert card["owned_by"] == "Triton Inference Server"
    assert MODEL in names(srv)
    assert httpx.get(f"{srv.base}/v1/models/{MODEL}", headers=REPO_KEY).json()["id"] == MODEL
    body = complete(srv).json()
    assert body["choices"][0]["text"] == "1 2 3" and body["usage"]["total_tokens"] > 0
    dup = manage(srv, MODEL, "load")
    assert dup.status_code == 400 and "already loaded" in dup.json()["error"]["message"]
    r = manage(srv, MODEL, "unload")
    assert r.status_code == 200 and r.json() == {"status": "success", "model": MODEL}
    assert MODEL not in names(srv)
    assert httpx.get(f"{srv.base}/v1/models/{MODEL}", headers=REPO_KEY).status_code == 404
    assert complete(srv).status_code == 404
    again = manage(srv, MODEL, "unload")
    assert again.status_code == 400 and "Unknown model" in again.json()["error"]["message"]
    assert manage(srv, MODEL, "load").status_code == 200
    assert complete(srv).json()["choices"][0]["text"] == "1 2 3"
    assert manage(srv, MODEL, "unload").status_code == 200


def test_concurrent_loads_one_wins(srv):
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        codes = sorted(f.result().status_code for f in [pool.submit(manage, srv, OTHER, "load") for _ in range(5)])
    assert codes == [200, 400, 400, 400, 400]
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        codes = sorted(f.result().status_code for f in [pool.submit(manage, srv, OTHER, "unload") for _ in range(5)])
    assert codes == [200, 400, 400, 400, 400]
    assert OTHER not in names(srv)


def test_unknown_and_invalid_names(srv):
    r = manage(srv, "unknown_model", "load")
    assert r.status_code == 404 and "Failed to load model 'unknown_model'" in r.json()["error"]["message"]
    assert manage(srv, "unknown_model", "unload").status_code == 400
    for name, status in [("..", 400), ("%20%20", 400), ("%0A%09", 400), ("model/..", 404), ("model/subdir", 404),
                         ("model/", 404), ("", 404), ("/etc/passwd", 404), ("../../etc", 404)]:
        for action in ("load", "unload"):
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            conn.request("POST", f"/v1/models/{name}/{action}", headers=REPO_KEY)
            response = conn.getresponse()
            assert response.status == status, (name, action, response.read())
            conn.close()


@pytest.mark.parametrize("headers, ok", [(None, False), (REPO_KEY, True), ({"model-key": "wrong-value"}, False),
                                         ({"wrong-key": "model-value"}, False), (INFER_KEY, False)])
def test_model_repository_restricted(srv, headers, ok):
    for r in (httpx.get(srv.base + "/v1/models", headers=headers),
              httpx.get(srv.base + "/v1/models/text_embed", headers=headers),
              manage(srv, "text_embed", "load", headers=headers)):
        if ok:
            assert r.status_code in (200, 400), r.text  # 400: already loaded
        else:
            assert r.status_code == 401
            assert r.json()["error"] == {"message": "This API is restricted, expecting header 'model-key' with valid "
                                                    "value", "type": "authentication_error", "param": None,
                                         "code": "invalid_auth"}


@pytest.mark.parametrize("headers, ok", [(None, False), (INFER_KEY, True), ({"infer-key": "x"}, False),
                                         (REPO_KEY, False)])
def test_inference_restricted(srv, headers, ok):
    chat = {"model": "text_embed", "messages": [{"role": "user", "content": "x"}]}
    for path, body in (("/v1/completions", {"model": "text_embed", "prompt": "x"}), ("/v1/chat/completions", chat)):
        r = httpx.post(srv.base + path, json=body, headers=headers)
        assert (r.status_code != 401) if ok else (r.status_code == 401), r.text


def test_embeddings_need_both_inference_and_embedding_keys(srv):
    body = {"model": "text_embed", "input": "x"}
    assert httpx.post(srv.base + "/v1/embeddings", json=body, headers=INFER_KEY).status_code == 401
    assert httpx.post(srv.base + "/v1/embeddings", json=body, headers=EMBED_KEY).status_code == 401
    r = httpx.post(srv.base + "/v1/embeddings", json=body, headers={**INFER_KEY, **EMBED_KEY})
    assert r.status_code == 200, r.text


def test_metrics_restricted_health_not(srv):
    assert httpx.get(srv.base + "/metrics").status_code == 401
    assert httpx.get(srv.base + "/metrics", headers=EMBED_KEY).status_code == 200
    assert httpx.get(srv.base + "/health/ready").status_code == 200


def test_none_mode_refuses_load_and_unload(module_server_factory, harness):
    none = openai_servers.start(module_server_factory, harness, {OTHER: OTHER})
    for action in ("load", "unload"):
        r = httpx.post(f"{none.base}/v1/models/{OTHER}/{action}")
        assert r.status_code == 400
        assert "model load/unload requires --model-control-mode=explicit" in r.json()["error"]["message"].lower()


@pytest.mark.parametrize("args, message", [
    (["unknown-endpoint", "k", "v"], "Unknown API 'unknown-endpoint'"),
    (["invalid,inference", "k", "v"], "Unknown API 'invalid'"),
    (["inference,inference", "k", "v"], "restricted api 'inference' can not be specified in multiple config groups"),
    (["inference", "k", "v", "--openai-restricted-api", "inference k2 v2"],
     "restricted api 'inference' can not be specified in multiple config groups"),
    (["inference k"], "expected '<apis> <header> <value>'"),
])
def test_bad_restriction_flags_stop_the_start(args, message, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    inferd = Path(sys.executable).parent / "inferd"
    done = subprocess.run([str(inferd), "--model-repository", str(tmp_path), "--openai-port", "1",
                           "--openai-restricted-api", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and message in done.stderr
