"""Dump the message/enum/service descriptors of one protobuf module set as JSON on stdout.

Usage: python _dump_descriptors.py ours|tritonclient. Run in its own process: our generated modules
and tritonclient's define the same `inference.*` names and cannot share one descriptor pool.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any


def _message(desc: Any, out: dict[str, Any]) -> None:
    fields = {}
    for f in desc.fields:
        fields[f.name] = {
            "number": f.number,
            "type": f.type,
            "repeated": f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED,
            "type_name": (f.message_type or f.enum_type).full_name if (f.message_type or f.enum_type) else "",
            "oneof": f.containing_oneof.name if f.containing_oneof else "",
        }
    out["messages"][desc.full_name] = {"fields": fields, "map_entry": desc.GetOptions().map_entry}
    for e in desc.enum_types:
        _enum(e, out)
    for n in desc.nested_types:
        _message(n, out)


def _enum(desc: Any, out: dict[str, Any]) -> None:
    out["enums"][desc.full_name] = {v.name: v.number for v in desc.values}


def dump(files: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"messages": {}, "enums": {}, "services": {}, "files": {}, "serialized": {}}
    for fd in files:
        out["serialized"][fd.name] = hashlib.sha256(fd.serialized_pb).hexdigest()
        out["files"][fd.name] = {"package": fd.package}
        for m in fd.message_types_by_name.values():
            _message(m, out)
        for e in fd.enum_types_by_name.values():
            _enum(e, out)
        for s in fd.services_by_name.values():
            out["services"][s.full_name] = {
                m.name: [
                    m.input_type.full_name,
                    m.output_type.full_name,
                    m.client_streaming,
                    m.server_streaming,
                ]
                for m in s.methods
            }
    return out


def main() -> None:
    which = sys.argv[1]
    if which == "ours":
        from inferd.supervisor._gen import grpc_service_pb2, model_config_pb2

        files = [grpc_service_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR]
    else:
        from tritonclient.grpc import model_config_pb2, service_pb2

        files = [service_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR]
    json.dump(dump(files), sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
