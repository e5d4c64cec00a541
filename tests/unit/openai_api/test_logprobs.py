"""openai_api/logprobs.py: vLLM's logprobs entries in OpenAI's chat and completions shapes."""

from __future__ import annotations

from inferd.supervisor.openai_api import logprobs

ENTRIES = [
    {"5": {"logprob": -0.5, "rank": 2, "decoded_token": "b"}, "3": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}},
    {}, "not an entry", {"x": 1},  # skipped
    {"9": {"logprob": -2, "decoded_token": "é"}, "8": {"logprob": -1.0, "rank": 1}},  # unranked last; no token: ""
]


def test_chat_shape():
    assert logprobs.chat(ENTRIES) == {"content": [
        {"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": [
            {"token": "a", "logprob": -0.1, "bytes": [97]}, {"token": "b", "logprob": -0.5, "bytes": [98]}]},
        {"token": "", "logprob": -1.0, "bytes": [], "top_logprobs": [
            {"token": "", "logprob": -1.0, "bytes": []}, {"token": "é", "logprob": -2.0, "bytes": [195, 169]}]},
    ]}


def test_completion_shape_counts_offsets_from_the_chunk_start():
    assert logprobs.completion(ENTRIES, 3) == {
        "tokens": ["a", ""], "token_logprobs": [-0.1, -1.0], "text_offset": [3, 4],
        "top_logprobs": [{"a": -0.1, "b": -0.5}, {"": -1.0, "é": -2.0}]}


def test_nothing_to_report_is_none():
    assert logprobs.chat([]) is None and logprobs.completion([{}, "x"]) is None
