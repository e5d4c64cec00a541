"""A closed-loop load on one model over HTTP with the unmodified tritonclient: `threads` clients, each
sending its next request as soon as the last one answered. Used by bench/reload.py and by the recycling
and reload tests (tests/e2e/test_recycling.py): every answer is kept with its time, latency and outcome."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Answer:
    at: float  # monotonic time the request was sent
    latency_s: float
    error: str = ""  # "" for a success
    pid: int = 0  # the PID output, when the model has one


@dataclass
class ClosedLoop:
    url: str  # host:port of the HTTP endpoint
    model: str
    make_inputs: Callable[[Any], list[Any]]  # (tritonclient.http module) -> the request's InferInput list
    threads: int = 4
    pid_output: str = ""  # an output holding the serving process's pid
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> ClosedLoop:
        for i in range(self.threads):
            t = threading.Thread(target=self._run, name=f"closed-loop-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def stop(self) -> list[Answer]:
        self._stop.set()
        for t in self._workers:
            t.join(60)
        return self.answers

    def count(self) -> int:
        with self._lock:
            return len(self.answers)

    def failures(self) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if a.error]

    def _run(self) -> None:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.url, connection_timeout=10.0, network_timeout=60.0)
        inputs = self.make_inputs(httpclient)
        try:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    result = client.infer(self.model, inputs)
                    pid = int(result.as_numpy(self.pid_output).reshape(-1)[0]) if self.pid_output else 0
                    answer = Answer(sent, time.monotonic() - sent, pid=pid)
                except Exception as exc:  # a failed request is what the callers count
                    answer = Answer(sent, time.monotonic() - sent, error=f"{type(exc).__name__}: {exc}")
                with self._lock:
                    self.answers.append(answer)
        finally:
            client.close()


def fp32_input(name: str, value: float) -> Callable[[Any], list[Any]]:
    """make_inputs for a model taking one FP32 [1] tensor."""

    def make(httpclient: Any) -> list[Any]:
        tensor = httpclient.InferInput(name, [1], "FP32")
        tensor.set_data_from_numpy(np.array([value], dtype=np.float32))
        return [tensor]

    return make


def percentile(latencies: list[float], q: float) -> float:
    return float(np.percentile(np.array(latencies), q)) if latencies else float("nan")
