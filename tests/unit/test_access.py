"""header_rules.py: restriction checks and header forwarding as Triton 2.51 applies them."""

from __future__ import annotations

import base64

from inferd.supervisor import header_rules as access


def test_restriction_compares_the_value_exactly() -> None:
    rule = access.http_restrictions({"health": ("Key", "S3cret")})["health"]
    assert rule.header == "key"
    assert rule.message == "This API is restricted, expecting header 'Key'"
    assert rule.allows("S3cret") and rule.allows(b"S3cret")
    for wrong in (None, "", "s3cret", "S3cret ", "S3cre"):
        assert not rule.allows(wrong)


def test_restriction_value_bytes_survive_either_decoding() -> None:
    rule = access.Restriction("k", "café", "m")
    raw = "café".encode()
    assert rule.allows(raw.decode("latin-1"))  # HTTP/1.1 and the native gRPC server decode latin-1
    assert rule.allows(raw.decode("utf-8"), "utf-8")  # grpcio decodes UTF-8
    assert not rule.allows("cafe")


def test_grpc_restriction_key_is_prefixed() -> None:
    rule = access.grpc_restrictions({"inference": ("admin", "v")})["inference"]
    assert rule.header == "triton-grpc-protocol-admin"
    assert rule.message == "This protocol is restricted, expecting header 'triton-grpc-protocol-admin'"


def test_first_value_counts() -> None:
    md = [("a", "1"), ("k", "first"), ("k", "second")]
    assert access.first_value(md, "k") == "first"
    assert access.first_value(md, "z") is None


def test_forward_pattern_partial_and_case_insensitive() -> None:
    assert access.forward_pattern("") is None
    pattern = access.forward_pattern("x-fw.*")
    assert pattern is not None
    assert pattern.search("X-FW-A") and pattern.search("my-x-fw") and not pattern.search("x-f")
    anchored = access.forward_pattern("^x-fw$")
    assert anchored is not None and anchored.search("X-Fw") and not anchored.search("x-fw-a")


def test_forward_pattern_re2_case_sensitive_prefix() -> None:
    pattern = access.forward_pattern("(?-i)x-fw.*")
    assert pattern is not None
    assert pattern.search("x-fw-b") and not pattern.search("X-Fw-Alpha")


def test_forward_http_keeps_order_names_and_the_last_repeat() -> None:
    pattern = access.forward_pattern("^x-")
    assert pattern is not None
    params: dict[str, object] = {"x-n": 7, "own": True}
    access.forward_http(pattern, [("X-B", "1"), ("Host", "h"), ("x-n", "9"), ("X-B", "2")], params)
    assert params == {"x-n": "9", "own": True, "X-B": "2"}


def test_forward_grpc_skips_transport_metadata_and_decodes_binary() -> None:
    pattern = access.forward_pattern(".*")
    assert pattern is not None
    params: dict[str, object] = {}
    metadata = [("user-agent", "ua"), ("te", "trailers"), ("grpc-accept-encoding", "gzip"), (":authority", "h"),
                ("content-type", "application/grpc"), ("z-bin", base64.b64encode("é".encode()).decode().rstrip("=")),
                ("y-bin", "é".encode()), ("a", "1")]
    access.forward_grpc(pattern, metadata, params)
    assert params == {"a": "1", "user-agent": "ua", "y-bin": "é", "z-bin": "é"}
    assert list(params) == ["a", "user-agent", "y-bin", "z-bin"]  # sorted by name, as Triton's map
