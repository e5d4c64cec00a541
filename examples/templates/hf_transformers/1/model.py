"""A Hugging Face transformers causal language model as a Triton Python model (decoupled), for models vLLM does
not run: tokenizer and weights from local files (config parameter `model_path`, relative to the model's folder),
each request generated on a thread of its own with `model.generate` and streamed with a `TextIteratorStreamer`
as the text comes.

Inputs as TensorRT-LLM's (what inferd's OpenAI frontend and Triton's generate endpoint send): `text_input`,
`max_tokens` (default 64), `stream`, `stop_words`, `temperature` (0 or absent: greedy), `top_p`, `top_k`,
`repetition_penalty`, `seed`; output `text_output` (the generated text, without the prompt). A streamed
request gets one response per piece of text the streamer yields, then an empty final one; a request whose
client went away stops generating at the next token.

Requests are not batched together (one generate call each, run side by side): this serves a model, it does
not make it fast. For throughput use an engine with continuous batching (the vLLM backend, docs/llm.md).
"""

import json
import os
import threading

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
)

STREAMER_TIMEOUT_S = 600.0  # a generate that produces nothing for this long has failed


def scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)
    if value.size == 0:
        return default
    value = value[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value.item()


def strings(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    return [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in tensor.as_numpy().reshape(-1) if w]


class StopWhen(StoppingCriteria):
    """Ends generate() once `done()` says so (the client went away, or a stop word was seen)."""

    def __init__(self, done):
        self.done = done

    def __call__(self, input_ids, scores, **kwargs):
        return self.done()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}
        path = params.get("model_path") or "hf_model"
        if not os.path.isabs(path):
            path = os.path.join(args["model_repository"], path)
        if not os.path.isdir(path):
            raise pb_utils.TritonModelException("model_path '%s' is not a folder holding the model's files" % path)
        if args.get("model_instance_kind") == "GPU":
            self.device = "cuda:%s" % args.get("model_instance_device_id", "0")
        else:
            self.device = "cpu"
        dtype = params.get("torch_dtype") or "auto"
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=dtype if dtype == "auto" else getattr(torch, dtype))
        self.model.to(self.device).eval()
        self.logger = pb_utils.Logger

    def execute(self, requests):
        for request in requests:  # each request generates on its own thread; execute returns at once
            threading.Thread(target=self.serve, args=(request,), daemon=True).start()
        return None

    def serve(self, request):
        sender = request.get_response_sender()
        try:
            self.generate(request, sender)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # every failure ends the request with its reason
            error = pb_utils.TritonError("%s: %s" % (type(exc).__name__, exc))
            sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def generate(self, request, sender):
        prompt = scalar(request, "text_input", "")
        stream = bool(scalar(request, "stream", False))
        stops = strings(request, "stop_words")
        settings = self.sampling(request)
        inputs = self.tokenizer(prompt, return_tensors="pt").to(self.device)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True,
                                        timeout=STREAMER_TIMEOUT_S)
        stopped = threading.Event()
        criteria = StoppingCriteriaList([StopWhen(lambda: stopped.is_set() or request.is_cancelled())])
        failure = []

        def run():
            try:
                with torch.no_grad():
                    self.model.generate(**inputs, streamer=streamer, stopping_criteria=criteria, **settings)
            except Exception as exc:  # reported by the request's thread
                failure.append(exc)
                streamer.end()

        threading.Thread(target=run, daemon=True).start()
        hold = max((len(w) for w in stops), default=1) - 1  # text kept back: a stop word may be split
        text, sent = "", 0
        for piece in streamer:
            text += piece
            cut = min((text.find(w) for w in stops if w in text), default=-1)
            if cut >= 0:
                text = text[:cut]
                stopped.set()
            ready = len(text) if cut >= 0 else len(text) - hold
            if stream and ready > sent:
                sender.send(self.response(text[sent:ready]))
                sent = ready
            if cut >= 0:
                break
        if failure:
            raise failure[0]
        if request.is_cancelled():
            return
        if not stream:
            sender.send(self.response(text))
        elif len(text) > sent:
            sender.send(self.response(text[sent:]))

    def sampling(self, request):
        """generate()'s keyword arguments from the request."""
        settings = {"max_new_tokens": max(1, int(scalar(request, "max_tokens", 64))),
                    "pad_token_id": self.tokenizer.pad_token_id or self.tokenizer.eos_token_id}
        temperature = float(scalar(request, "temperature", 0.0))
        if temperature > 0:
            settings.update(do_sample=True, temperature=temperature, top_p=float(scalar(request, "top_p", 1.0)),
                            top_k=int(scalar(request, "top_k", 0)))
            seed = scalar(request, "seed", None)
            if seed is not None:  # (torch's global generator: requests running side by side share it)
                torch.manual_seed(int(seed))
        else:
            settings["do_sample"] = False
        penalty = scalar(request, "repetition_penalty", None)
        if penalty is not None:
            settings["repetition_penalty"] = float(penalty)
        return settings

    @staticmethod
    def response(text):
        return pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([text.encode("utf-8")],
                                                                                    dtype=np.object_))])

    def finalize(self):
        self.model = None
