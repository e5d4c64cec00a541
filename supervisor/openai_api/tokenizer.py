"""Tokenizers and chat templates for the OpenAI frontend, read from local files only.

`load_tokenizer(path)` takes a directory (a Hugging Face model or tokenizer folder) or a tokenizer.json
file and returns a `Tokenizer`: `encode`, `decode`, `count` and `apply_chat_template`. Nothing is ever
downloaded: a path that is not on disk (a hub id, say) is refused with a `TokenizerError` naming it.

Two readers, chosen by what the folder holds:
- tokenizer.json (every "fast" tokenizer, which is nearly every current model): the `tokenizers` library
  encodes, and the chat template from tokenizer_config.json (or chat_template.jinja / chat_template.json
  beside it) is rendered here with jinja2's sandbox, with the variables and filters Hugging Face
  templates expect. This is the light path: no transformers import (seconds, hundreds of MB).
- no tokenizer.json (a sentencepiece tokenizer.model, a vocab.txt): transformers' AutoTokenizer when it is
  installed (local_files_only, no remote code), else a TokenizerError saying what is missing.

`encode` adds no special tokens by default: a rendered chat template already holds them (pass
add_special_tokens=True to count a raw completion prompt as an engine would). Encoding a long text takes
milliseconds (about 5 us a word on the 2-vCPU host) and, above GIL_FREE_CHARS characters, releases the GIL:
run such a count in a thread (asyncio.to_thread) rather than on the event loop.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from collections.abc import Sequence
from typing import Any

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
_TEMPLATE_CACHE_MAX = 16
# texts longer than this are encoded without holding the GIL (milliseconds for a long prompt), so a caller
# may count them on a worker thread while the event loop goes on
GIL_FREE_CHARS = 4096


class TokenizerError(Exception):
    """A tokenizer that cannot be loaded, or a chat template that cannot be rendered (message says which)."""


class ChatTemplateError(TokenizerError):
    """The chat template refused the conversation (raise_exception) or failed on it: a client error."""


class Tokenizer:
    """One loaded tokenizer; safe to share between threads and requests."""

    def __init__(self, path: str, special_tokens: dict[str, str], chat_template: str | dict[str, str] | None,
                 extra_context: dict[str, Any] | None = None) -> None:
        self.path = path
        self.special_tokens = special_tokens
        # a str, or {name: template} when the config names several ("default", "tool_use", ...)
        self.chat_template = chat_template
        self._extra_context = extra_context or {}

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        raise NotImplementedError

    def count(self, text: str, add_special_tokens: bool = False) -> int:
        return len(self.encode(text, add_special_tokens))

    def apply_chat_template(self, messages: list[dict], *, tools: list[dict] | None = None,
                            add_generation_prompt: bool = True, template: str | None = None,
                            **extra: Any) -> str:
        """The prompt for `messages` (OpenAI chat messages) rendered by `template` (a --chat-template
        file's text) or else the tokenizer's own template. `extra` reaches the template as variables
        (e.g. documents, or a model's own switches such as enable_thinking)."""
        source = template if template is not None else self._pick_template(bool(tools))
        if source is None:
            raise TokenizerError(f"the tokenizer at {self.path} has no chat template (no chat_template in "
                                 f"{TOKENIZER_CONFIG}, no chat_template.jinja): give one with --chat-template FILE")
        context: dict[str, Any] = dict(self._extra_context)
        context.update(self.special_tokens)
        context.update(extra)
        context.update(messages=_template_messages(messages), tools=tools or None,
                       add_generation_prompt=add_generation_prompt)
        return render_chat_template(source, context)

    def template_compiled(self, with_tools: bool = False, template: str | None = None) -> bool:
        """True when the template `apply_chat_template` would render is compiled already (so rendering it
        costs only the rendering: no compile, which can take milliseconds for a long template)."""
        source = template if template is not None else self._pick_template(with_tools)
        return source is not None and source in _compiled

    def _pick_template(self, with_tools: bool) -> str | None:
        t = self.chat_template
        if t is None or isinstance(t, str):
            return t
        if with_tools and "tool_use" in t:
            return t["tool_use"]
        if "default" in t:
            return t["default"]
        return None


class _FastTokenizer(Tokenizer):
    """tokenizer.json through the `tokenizers` library (Rust)."""

    def __init__(self, path: str, backend: Any, special_tokens: dict[str, str],
                 chat_template: str | dict[str, str] | None) -> None:
        super().__init__(path, special_tokens, chat_template)
        self._backend = backend

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if len(text) > GIL_FREE_CHARS:  # encode() holds the GIL throughout, encode_batch() lets it go
            return list(self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))


class _TransformersTokenizer(Tokenizer):
    """Any tokenizer transformers reads from a local folder (used only without tokenizer.json)."""

    def __init__(self, path: str, backend: Any) -> None:
        special = {k: v for k in SPECIAL_TOKEN_KEYS if isinstance(v := getattr(backend, k, None), str)}
        super().__init__(path, special, getattr(backend, "chat_template", None))
        self._backend = backend

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))


def load_tokenizer(path: str) -> Tokenizer:
    """The tokenizer in local directory or tokenizer.json file `path`; TokenizerError naming it otherwise."""
    if not path:
        raise TokenizerError("no tokenizer path given")
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isfile(full):
        if os.path.basename(full) != TOKENIZER_JSON and not full.endswith(".json"):
            raise TokenizerError(f"tokenizer {path!r} is a file but not a tokenizer.json: give the tokenizer's "
                                 "directory or its tokenizer.json")
        return _load_fast(path, full, os.path.dirname(full))
    if not os.path.isdir(full):
        raise TokenizerError(f"tokenizer {path!r} is not a local directory or tokenizer.json file ({full} does "
                             "not exist); inferd never downloads tokenizers: fetch the files first (e.g. "
                             "`huggingface-cli download <repo> --local-dir DIR`) and give that directory")
    if os.path.isfile(os.path.join(full, TOKENIZER_JSON)):
        return _load_fast(path, os.path.join(full, TOKENIZER_JSON), full)
    return _load_transformers(path, full)


def _load_fast(path: str, json_file: str, folder: str) -> Tokenizer:
    try:
        import tokenizers
    except ImportError as exc:
        raise TokenizerError(f"reading tokenizer {path!r} needs the `tokenizers` package: "
                             "pip install 'inferd[openai]'") from exc
    try:
        backend = tokenizers.Tokenizer.from_file(json_file)
    except Exception as exc:  # the Rust side raises plain Exception on any bad file
        raise TokenizerError(f"cannot read tokenizer {json_file}: {exc}") from exc
    config = _read_json(os.path.join(folder, TOKENIZER_CONFIG), path) or {}
    special = _special_tokens(config)
    special_map = _read_json(os.path.join(folder, "special_tokens_map.json"), path) or {}
    for key, value in _special_tokens(special_map).items():
        special.setdefault(key, value)
    return _FastTokenizer(path, backend, special, _find_template(config, folder, path))


def _load_transformers(path: str, folder: str) -> Tokenizer:
    try:
        import transformers
    except ImportError as exc:
        raise TokenizerError(f"tokenizer directory {path!r} has no {TOKENIZER_JSON}; reading its other formats "
                             "(sentencepiece tokenizer.model, vocab.txt) needs `pip install transformers`") from exc
    try:
        backend = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise TokenizerError(f"transformers cannot read the tokenizer in {path!r}: {exc}") from exc
    tok = _TransformersTokenizer(path, backend)
    if tok.chat_template is None:  # older transformers leave a separate template file unread
        tok.chat_template = _find_template({}, folder, path)
    return tok


def _read_json(file: str, path: str) -> dict | None:
    if not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read {file} (tokenizer {path!r}): {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"{file} (tokenizer {path!r}) is not a JSON object")
    return data


def _special_tokens(config: dict) -> dict[str, str]:
    """bos_token etc. as strings: configs write them as strings or as AddedToken objects {"content": ...}."""
    out: dict[str, str] = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def _find_template(config: dict, folder: str, path: str) -> str | dict[str, str] | None:
    """tokenizer_config.json's chat_template (a string or a list of named ones), else the separate files
    newer transformers write: chat_template.jinja, or chat_template.json {"chat_template": ...}."""
    found = _named_templates(config.get("chat_template"), path)
    if found is not None:
        return found
    jinja_file = os.path.join(folder, TEMPLATE_FILES[0])
    if os.path.isfile(jinja_file):
        try:
            with open(jinja_file, encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            raise TokenizerError(f"cannot read {jinja_file}: {exc}") from exc
    data = _read_json(os.path.join(folder, TEMPLATE_FILES[1]), path)
    return _named_templates(data.get("chat_template") if data else None, path)


def _named_templates(value: Any, path: str) -> str | dict[str, str] | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                       and isinstance(t.get("template"), str) for t in value):
        return {t["name"]: t["template"] for t in value}
    raise TokenizerError(f"tokenizer {path!r}: chat_template must be a string or a list of "
                         '{"name": ..., "template": ...} objects')


def _template_messages(messages: list[dict]) -> list[dict]:
    """Messages as templates expect them: an assistant tool call's `arguments` as an object, not the JSON
    string OpenAI clients send back (templates write it with tojson). Copies; the caller's stay as given."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not calls or not isinstance(calls, list):
            out.append(message)
            continue
        fixed = []
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    args = json.loads(fn["arguments"])
                except ValueError:
                    args = None
                if isinstance(args, dict):
                    call = {**call, "function": {**fn, "arguments": args}}
            fixed.append(call)
        out.append({**message, "tool_calls": fixed})
    return out


# ---------------------------------------------------------------------------------------------- templates

_env_lock = threading.Lock()
_env: Any = None
_compiled: dict[str, Any] = {}


def render_chat_template(source: str, context: dict[str, Any]) -> str:
    """`source` rendered in the sandbox with `context`; ChatTemplateError for any failure while rendering,
    TokenizerError when the template does not compile."""
    import jinja2

    template = _compile(source)
    try:
        return str(template.render(**context))
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template failed: {exc}") from exc
    except Exception as exc:  # a template calling a method with the wrong values, dividing by zero, ...
        raise ChatTemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc


def _compile(source: str) -> Any:
    template = _compiled.get(source)
    if template is not None:
        return template
    import jinja2

    with _env_lock:
        env = _environment()
        try:
            template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"the chat template does not compile: {exc}") from exc
        if len(_compiled) >= _TEMPLATE_CACHE_MAX:
            _compiled.pop(next(iter(_compiled)))
        _compiled[source] = template
    return template


def _environment() -> Any:
    """The sandboxed environment, as Hugging Face renders templates: trim_blocks and lstrip_blocks, loop
    controls, a tojson that leaves non-ASCII and <>& alone, raise_exception and strftime_now, and the
    {% generation %} block (rendered as plain text)."""
    global _env
    if _env is not None:
        return _env
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """{% generation %}...{% endgeneration %} marks assistant text for training masks; here it only
        renders its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    _env = env
    return env


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused the messages: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)
