"""tiny_llm: a language model with no weights, to try the OpenAI API (`inferd --openai-port 9000`)
without downloading anything. It streams its answer word by word, like an LLM, and its answers are
deterministic:

- a chat (the prompt its chat template makes, see ../make_tokenizer.py) ending with a user message:
  `You said "<message>". Backwards: <its words in reverse order>.`
- the same when the request lists tools: a call of the first tool, its first string parameter set to the
  last capitalised word of the message ("weather in Paris?" -> "Paris"), in Llama 3's JSON form
  {"name": ..., "parameters": {...}} (serve with --tool-call-parser llama3 to get OpenAI tool_calls);
- a chat ending with a tool's result: `The tool answered: <result>.`
- a plain completion prompt: its words in reverse order.

Inputs as TensorRT-LLM's (text_input, max_tokens, stream, stop_words; temperature and the other sampling
settings are accepted and ignored), output text_output. The request stops at max_tokens words or before a
stop word, and as soon as the client goes away (is_cancelled). Config parameter token_delay_ms paces it.
"""

import json
import re
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

HEADER = re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)(?:<\|eot_id\|>|$)", re.S)
WORD = re.compile(r"\s*\S+")


def messages_of(prompt):
    """(role, content) of each message in a prompt the chat template wrote."""
    return [(m.group(1), m.group(2)) for m in HEADER.finditer(prompt)]


def tools_of(messages):
    """Tools the template listed (one JSON object per line in a system message)."""
    tools = []
    for role, content in messages:
        if role != "system":
            continue
        for line in content.splitlines():
            if line.startswith("{"):
                try:
                    tool = json.loads(line)
                except ValueError:
                    continue
                if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
                    tools.append(tool["function"])
    return tools


def call_tool(tool, message):
    """A call of `tool` taking the message's last capitalised word as its first string parameter."""
    props = (tool.get("parameters") or {}).get("properties") or {}
    required = (tool.get("parameters") or {}).get("required") or list(props)
    names = [p for p in required if (props.get(p) or {}).get("type", "string") == "string"]
    words = re.findall(r"[A-Z][\w-]*", message)
    args = {names[0]: words[-1] if words else message.strip()} if names else {}
    return json.dumps({"name": tool.get("name", ""), "parameters": args})


def answer(prompt):
    messages = messages_of(prompt)
    if not messages:
        return " " + " ".join(reversed(prompt.split()))
    messages = [(r, c) for r, c in messages if r != "assistant" or c.strip()]  # the open assistant turn
    role, content = messages[-1] if messages else ("user", "")
    if role == "ipython":
        return "The tool answered: %s." % content.strip()
    tools = tools_of(messages)
    if tools and role == "user":
        return call_tool(tools[0], content)
    backwards = " ".join(reversed(content.split()))
    return 'You said "%s". Backwards: %s.' % (content.strip(), backwards)


def scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)
    if value.size == 0:
        return default
    value = value[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value.item()


def stop_words(request):
    tensor = pb_utils.get_input_tensor_by_name(request, "stop_words")
    if tensor is None:
        return []
    return [w.decode("utf-8", "replace") if isinstance(w, bytes) else str(w) for w in tensor.as_numpy().reshape(-1)]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}
        self.delay = float(params.get("token_delay_ms") or 0) / 1000.0

    def execute(self, requests):
        for request in requests:  # each request streams on its own thread; execute returns at once
            threading.Thread(target=self.generate, args=(request,), daemon=True).start()
        return None

    def generate(self, request):
        sender = request.get_response_sender()
        try:
            text = answer(scalar(request, "text_input", ""))
            for word in stop_words(request):
                if word and word in text:
                    text = text[:text.index(word)]
            tokens = WORD.findall(text)[:max(0, int(scalar(request, "max_tokens", 64)))]
            stream = bool(scalar(request, "stream", False))
            start, sent = time.monotonic(), []
            for i, token in enumerate(tokens):
                if self.delay:
                    time.sleep(max(0.0, start + (i + 1) * self.delay - time.monotonic()))
                if request.is_cancelled():
                    break
                if stream:
                    sender.send(self.response(token))
                else:
                    sent.append(token)
            if not stream:
                sender.send(self.response("".join(sent)))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("tiny_llm: %s" % exc)),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    @staticmethod
    def response(text):
        text_output = np.array([[text.encode()]], dtype=np.object_)  # [batch 1, one string]
        return pb_utils.InferenceResponse([pb_utils.Tensor("text_output", text_output)])
