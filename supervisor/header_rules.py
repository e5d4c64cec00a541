"""tritonserver's per-request header rules, shared by the HTTP and gRPC frontends.

Restricted APIs (--http-restricted-api, --grpc-restricted-protocol; config.RESTRICTABLE names the
categories): a category answers only requests that carry header (HTTP) / metadata (gRPC) KEY with
VALUE. As Triton 2.51 does it (observed):
- HTTP: anything else gets 403, `Content-Type: text/plain`, body
  `{"error":"This API is restricted, expecting header '<KEY>'"}`, checked before the method, the model
  or the body are looked at. The header name matches in any case, the value exactly (case-sensitive,
  no trimming of trailing blanks). The metrics port is never restricted.
- gRPC: the metadata key is `triton-grpc-protocol-<KEY>`; anything else gets UNAVAILABLE
  `This protocol is restricted, expecting header 'triton-grpc-protocol-<KEY>'`. When the key is given
  more than once, the first value counts. grpc.health.v1 Health/Check is a "health" call.
  (Triton compares the key as typed on its command line against the lower-case names gRPC delivers,
  so a key with capitals can never be satisfied there; inferd matches keys in any case, so it can.)

Header forwarding (--http-header-forward-pattern, --grpc-header-forward-pattern): on inference requests
(HTTP /infer, gRPC ModelInfer and ModelStreamInfer; not /generate), each header whose name the pattern
matches anywhere (RE2 PartialMatch), ignoring case, becomes a string parameter named as the client
spelled it. Triton appends them after the request's own parameters, so a header wins over a request
parameter of the same name in what the model parses from `request.parameters()`; a header sent twice
arrives twice (the last one wins when parsed). gRPC's own metadata (te, grpc-*, content-type) is not
forwarded; user-agent is.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from collections.abc import Iterable, Mapping

GRPC_PREFIX = "triton-grpc-protocol-"
_CASE_SENSITIVE = "(?-i)"


class Restriction:
    """One restricted category: the header (lower-cased) that must hold `value`, and the refusal text."""

    __slots__ = ("header", "_value", "message")

    def __init__(self, header: str, value: str, message: str) -> None:
        self.header = header.lower()
        self._value = value.encode("utf-8", "surrogateescape")  # as the bytes given on the command line
        self.message = message

    def allows(self, given: str | bytes | None, encoding: str = "latin-1") -> bool:
        """Whether a header value (the str the protocol layer decoded with `encoding`) is the one
        required; compared in constant time."""
        if given is None:
            return False
        if isinstance(given, bytes):
            return hmac.compare_digest(given, self._value)
        try:
            raw = given.encode(encoding)
        except UnicodeEncodeError:
            raw = given.encode("utf-8", "surrogateescape")
        return hmac.compare_digest(raw, self._value)


def http_restrictions(restricted: Mapping[str, tuple[str, str]]) -> dict[str, Restriction]:
    """category -> Restriction, from --http-restricted-api (config.http_restricted)."""
    return {cat: Restriction(key, value, f"This API is restricted, expecting header '{key}'")
            for cat, (key, value) in restricted.items()}


def grpc_restrictions(restricted: Mapping[str, tuple[str, str]]) -> dict[str, Restriction]:
    """category -> Restriction, from --grpc-restricted-protocol (config.grpc_restricted): the metadata
    key carries Triton's `triton-grpc-protocol-` prefix."""
    out = {}
    for cat, (key, value) in restricted.items():
        header = GRPC_PREFIX + key
        out[cat] = Restriction(header, value, f"This protocol is restricted, expecting header '{header}'")
    return out


def first_value(metadata: Iterable[tuple[str, str | bytes]], key: str) -> str | bytes | None:
    """The first value of `key` in gRPC metadata (lower-case names), None when absent."""
    for name, value in metadata:
        if name == key:
            return value
    return None


def forward_pattern(pattern: str) -> re.Pattern[str] | None:
    """A --*-header-forward-pattern compiled as Triton applies it: matched anywhere in the name and
    ignoring case, unless it starts with RE2's `(?-i)` (which Python spells as a scoped group).
    None for the empty pattern (nothing is forwarded)."""
    if not pattern:
        return None
    if pattern.startswith(_CASE_SENSITIVE):
        return re.compile(f"(?-i:{pattern[len(_CASE_SENSITIVE):]})", re.IGNORECASE)
    return re.compile(pattern, re.IGNORECASE)


# gRPC metadata the transport itself uses: gRPC core keeps it from the application, so Triton never
# forwards it
_GRPC_RESERVED = frozenset({"te", "content-type", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"})


def forward_http(pattern: re.Pattern[str], headers: Iterable[tuple[str, str]], params: dict[str, object]) -> None:
    """Add the matching headers (in arrival order) to an inference request's parameters."""
    search = pattern.search
    for name, value in headers:
        if search(name) is not None:
            params[name] = value


def forward_grpc(pattern: re.Pattern[str], metadata: Iterable[tuple[str, str | bytes]],
                 params: dict[str, object]) -> None:
    """Add the matching metadata to an inference request's parameters. Names come sorted, as Triton's
    metadata map iterates; binary (`-bin`) values arrive as their decoded bytes read as UTF-8."""
    search = pattern.search
    for name, value in sorted(metadata, key=lambda item: item[0]):
        if name[0] == ":" or name in _GRPC_RESERVED or name.startswith("grpc-") or search(name) is None:
            continue
        if isinstance(value, str) and name.endswith("-bin"):  # still base64 as on the wire (native server)
            try:
                value = base64.b64decode(value + "=" * (-len(value) % 4))
            except (binascii.Error, ValueError):
                continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        params[name] = value
