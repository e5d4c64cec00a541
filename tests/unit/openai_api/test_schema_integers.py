"""openai_api/schema.py: integer fields hold 64 bits at most. A larger one used to pass the schema, then
fail building a vLLM model's sampling_parameters (orjson refuses integers past 64 bits): a 500 for a
client's mistake."""

from __future__ import annotations

import pytest
from inferd.supervisor.openai_api import conventions, schema
from inferd.supervisor.openai_api.errors import OpenAIError

VLLM_MODEL = {"backend": "vllm", "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
                                           {"name": "sampling_parameters", "data_type": "TYPE_STRING", "dims": [1]}]}


@pytest.mark.parametrize("field", ["top_k", "max_tokens", "min_tokens"])
@pytest.mark.parametrize("value", [2**64, -(2**70), 1e30])
def test_integers_past_64_bits_are_422(field, value):
    body = {"model": "m", "prompt": "hi", field: value}
    with pytest.raises(OpenAIError) as err:
        schema.check(body, schema.COMPLETION)
    assert err.value.status == 422 and err.value.param == field


def test_the_largest_64_bit_integer_reaches_a_vllm_model():
    body = schema.check({"model": "m", "prompt": "hi", "top_k": 2**63 - 1}, schema.COMPLETION)
    gen = conventions.Generation(prompt="hi", body=body, stream=False, max_tokens=16)
    request = conventions.generate_request("m", "", conventions.ModelInputs.of(VLLM_MODEL), gen)
    assert b'"top_k":9223372036854775807' in bytes(request.inputs[1].data)
