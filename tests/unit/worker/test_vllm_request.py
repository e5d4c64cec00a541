"""The vLLM backend's request reading, auto-complete and response tensors (worker/backends/vllm_request.py), as
Triton's vllm_backend defines them; these parts need no vLLM (engine tests: tests/e2e/test_vllm_engine.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from inferd.worker.backends import vllm_request
from inferd.worker.backends.base import Request, Tensor
from inferd.worker.wire.errors import ErrorCode, InferdError


def _request(parameters: str = "{}", **inputs: object) -> Request:
    tensors = []
    for name, value in inputs.items():
        if isinstance(value, bool):
            tensors.append(Tensor(name, "BOOL", np.array([value])))
        else:
            tensors.append(Tensor(name, "BYTES", np.array([str(value).encode()], dtype=object)))
    return Request(1, "", tensors, [], parameters=parameters)


def test_auto_complete_adds_what_vllm_backend_declares_and_keeps_the_rest() -> None:
    config = {"name": "m", "backend": "vllm", "input": [{"name": "text_input", "data_type": "TYPE_STRING",
                                                         "dims": [-1]}], "output": []}
    done = vllm_request.auto_complete(config)
    names = [i["name"] for i in done["input"]]
    assert names[0] == "text_input" and done["input"][0]["dims"] == [-1]  # the config's own entry stays
    assert set(names) >= {"stream", "sampling_parameters", "exclude_input_in_output", *vllm_request.RETURN_FLAGS}
    assert [o["name"] for o in done["output"]] == ["text_output", "finish_reason", "cumulative_logprob",
                                                   "logprobs", "num_input_tokens", "num_output_tokens"]
    assert done["model_transaction_policy"] == {"decoupled": True} and done["max_batch_size"] == 0
    assert config["output"] == []  # not changed in place


def test_parse_reads_inputs_as_vllm_backend() -> None:
    asked = vllm_request.parse(_request(text_input="Hi", sampling_parameters='{"max_tokens": "4", "lora_name": "a"}',
                                        return_num_input_tokens=True))
    assert (asked.prompt, asked.stream, asked.prepend_input) == ("Hi", False, True)
    assert asked.parameters == {"max_tokens": "4"} and asked.lora_name == "a"
    assert asked.flags["return_num_input_tokens"] and not asked.flags["return_logprobs"]
    streamed = vllm_request.parse(_request('{"temperature": 0}', text_input="Hi", stream=True))
    assert not streamed.prepend_input and streamed.parameters == {"temperature": 0}  # request parameters
    assert not vllm_request.parse(_request(text_input="x", exclude_input_in_output=True)).prepend_input


@pytest.mark.parametrize(("inputs", "words"), [
    ({"text_input": "x", "stream": True, "exclude_input_in_output": False}, "exclude_input_in_output"),
    ({"text_input": "x", "sampling_parameters": "{not json"}, "sampling_parameters is not valid JSON"),
    ({"text_input": "x", "sampling_parameters": "[1]"}, "must be a JSON object"),
    ({"stream": True}, "'text_input'"),
])
def test_parse_refuses_with_the_reason(inputs: dict, words: str) -> None:
    with pytest.raises(InferdError) as info:
        vllm_request.parse(_request(**inputs))
    assert info.value.code == ErrorCode.INVALID_ARG and words in info.value.message


class _Sampling:
    """A stand-in with SamplingParams' constructor contract (annotated fields, ValueError on a bad value):
    the real class is exercised by the engine tests."""

    __struct_fields__ = ("max_tokens", "temperature", "ignore_eos", "stop")
    max_tokens: int | None
    temperature: float
    ignore_eos: bool
    stop: list[str] | None

    def __init__(self, **kw: object) -> None:
        if float(kw.get("temperature", 1.0)) < 0:  # type: ignore[arg-type]
            raise ValueError("temperature must be non-negative, got %s." % kw["temperature"])
        self.kw = kw


def test_sampling_parameters_convert_strings_and_name_refusals() -> None:
    params = vllm_request.sampling_params(_Sampling, {"max_tokens": "16", "temperature": "0", "ignore_eos": "false",
                                                      "stop": ["."]})
    assert params.kw == {"max_tokens": 16, "temperature": 0.0, "ignore_eos": False, "stop": ["."]}
    for bad, words in (({"top_q": 1}, "unknown sampling parameter 'top_q'"),
                       ({"max_tokens": "many"}, "'max_tokens' must be int"),
                       ({"temperature": -1}, "temperature must be non-negative")):
        with pytest.raises(InferdError) as info:
            vllm_request.sampling_params(_Sampling, bad)
        assert info.value.code == ErrorCode.INVALID_ARG and words in info.value.message


def _output(text: str, tokens: list[int], finished: bool = False) -> SimpleNamespace:
    seq = SimpleNamespace(text=text, token_ids=tokens, finish_reason="length" if finished else None,
                          cumulative_logprob=-1.5, logprobs=None)
    return SimpleNamespace(prompt="P:", prompt_token_ids=[1, 2, 3], outputs=[seq], finished=finished)


def test_streamed_responses_carry_what_is_new() -> None:
    asked = vllm_request.parse(_request(text_input="P:", stream=True, return_num_output_tokens=True,
                                        return_finish_reason=True, return_num_input_tokens=True))
    builder = vllm_request.ResponseBuilder(asked, [])
    first = {t.name: t.array for t in builder.response(_output("ab", [5, 6]), False).outputs}
    second = {t.name: t.array for t in builder.response(_output("abc", [5, 6, 7], True), False).outputs}
    assert list(first["text_output"]) == [b"ab"] and list(second["text_output"]) == [b"c"]
    assert list(first["num_output_tokens"]) == [2] and list(second["num_output_tokens"]) == [1]
    assert list(second["finish_reason"]) == [b"length"] and second["num_input_tokens"].tolist() == [3]
    assert second["num_input_tokens"].dtype == np.uint32


def test_delta_outputs_are_sent_as_they_are() -> None:
    # (RequestOutputKind.DELTA, what a streamed one-sequence request gets: each output holds the new part only)
    asked = vllm_request.parse(_request(text_input="P:", stream=True, return_num_output_tokens=True,
                                        return_finish_reason=True, return_num_input_tokens=True))
    builder = vllm_request.ResponseBuilder(asked, [], delta=True)
    first = {t.name: t.array for t in builder.response(_output("ab", [5, 6]), False).outputs}
    second = {t.name: t.array for t in builder.response(_output("c", [7], True), False).outputs}
    assert list(first["text_output"]) == [b"ab"] and list(second["text_output"]) == [b"c"]
    assert list(first["num_output_tokens"]) == [2] and list(second["num_output_tokens"]) == [1]
    assert list(first["finish_reason"]) == [b"None"] and list(second["finish_reason"]) == [b"length"]
    assert second["num_input_tokens"].tolist() == [3]


def test_whole_response_prepends_the_prompt_and_keeps_requested_outputs_only() -> None:
    asked = vllm_request.parse(_request(text_input="P:", return_cumulative_logprob=True, return_logprobs=True))
    out = vllm_request.ResponseBuilder(asked, ["text_output", "logprobs"]).response(_output("ab", [5], True), True)
    tensors = {t.name: t.array for t in out.outputs}
    assert list(tensors) == ["text_output", "logprobs"] and list(tensors["text_output"]) == [b"P:ab"]
    assert json.loads(tensors["logprobs"][0]) is None
