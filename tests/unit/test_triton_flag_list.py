"""docs/triton-flags.md against the code (issue 43 item 8): the table lists exactly the flags of tritonserver
2.73, and each row's examples parse as its status says. Parsing only (flags.parse_args), no server.

- works: the accepted example parses and the start-up log does not call the flag ignored or inert;
- ignored / no effect: it parses and the start-up log names the flag so;
- refused, works (issue 43 item N): the accepted example parses;
- every refused example stops the start with a message naming the flag.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from inferd.supervisor.flags import build_parser, parse_args

TABLE = Path(__file__).resolve().parents[2] / "docs" / "triton-flags.md"

# tritonserver 2.73 (server src/command_line_parser.cc of the 2.73 branch), every long option
TRITONSERVER_2_73 = frozenset("--" + name for name in re.findall(r"[a-z0-9-]+", """
allow-client-shm allow-cpu-metrics allow-gpu-metrics allow-grpc allow-http allow-metrics allow-sagemaker
allow-vertex-ai backend-config backend-directory buffer-manager-thread-count cache-config cache-directory
cuda-memory-pool-byte-size cuda-virtual-address-size disable-auto-complete-config enable-peer-access
exit-on-error exit-timeout-secs grpc-address grpc-header-forward-pattern grpc-http2-max-ping-strikes
grpc-http2-max-pings-without-data grpc-http2-min-recv-ping-interval-without-data
grpc-infer-allocation-pool-size grpc-infer-response-compression-level grpc-infer-thread-count
grpc-keepalive-permit-without-calls grpc-keepalive-time grpc-keepalive-timeout grpc-max-connection-age
grpc-max-connection-age-grace grpc-max-response-pool-size grpc-port grpc-restricted-protocol grpc-root-cert
grpc-server-cert grpc-server-key grpc-use-ssl grpc-use-ssl-mutual help host-policy http-address
http-header-forward-pattern http-max-input-size http-port http-restricted-api http-thread-count id load-model
log-error log-file log-format log-info log-verbose log-warning metrics-address metrics-config
metrics-interval-ms metrics-port min-supported-compute-capability model-config-name model-control-mode
model-load-gpu-limit model-load-retry-count model-load-thread-count model-namespacing model-repository
model-store pinned-memory-pool-byte-size rate-limit rate-limit-resource repoagent-directory
repository-poll-secs response-cache-byte-size reuse-grpc-port reuse-http-port sagemaker-port
sagemaker-safe-port-range sagemaker-thread-count strict-model-config strict-readiness trace-config trace-count
trace-file trace-level trace-log-frequency trace-rate vertex-ai-default-model vertex-ai-port
vertex-ai-thread-count"""))

STATUSES = ("works", "ignored", "no effect", "refused")
_FLAG = re.compile(r"`(--[a-z0-9-]+)`")


def _code(cell: str) -> list[str]:
    cell = cell.strip()
    return cell.strip("`").split() if cell else []


def table() -> list[tuple[str, str, list[str], list[str]]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        if not line.startswith("| `--"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 5, line
        flag = _FLAG.fullmatch(cells[0])
        assert flag, line
        rows.append((flag.group(1), cells[1], _code(cells[2]), _code(cells[3])))
    return rows


ROWS = table()


def parse(tmp_path, args: list[str], environ: dict[str, str] | None = None):
    return parse_args(["--model-repository", str(tmp_path), "--run-dir", str(tmp_path / "run"), *args],
                      environ={} if environ is None else environ)


def test_the_table_lists_every_flag_of_tritonserver_once():
    flags = [row[0] for row in ROWS]
    assert len(flags) == len(set(flags)), [f for f in flags if flags.count(f) > 1]
    assert set(flags) == TRITONSERVER_2_73, (sorted(TRITONSERVER_2_73 - set(flags)),
                                             sorted(set(flags) - TRITONSERVER_2_73))


def test_every_status_is_one_of_the_documented_ones():
    for flag, status, accepted, _ in ROWS:
        assert status.split(" (")[0] in STATUSES, (flag, status)
        assert status == "works" or re.fullmatch(r"works \(issue 43 item \d+\)", status) or status in STATUSES
        assert accepted and flag in " ".join(accepted), f"{flag}: no accepted example naming it"


def test_the_parser_knows_every_flag():
    known = set(build_parser()._option_string_actions)
    assert sorted(TRITONSERVER_2_73 - known) == []


def _notes_about(config, flag: str) -> list[str]:
    return [line for line in config.inert_flags if line.startswith(flag + "=")]


@pytest.mark.parametrize(("flag", "status", "accepted"), [(f, s, a) for f, s, a, _ in ROWS], ids=[r[0] for r in ROWS])
def test_the_accepted_example_runs_as_its_status_says(tmp_path, flag, status, accepted):
    if flag == "--help":
        with pytest.raises(SystemExit) as info:
            parse(tmp_path, accepted)
        assert info.value.code == 0
        return
    notes = _notes_about(parse(tmp_path, accepted), flag)
    if status == "works":
        assert notes == [], notes
    elif status == "ignored":
        assert notes and "is ignored, as tritonserver ignores it" in notes[0], notes
    elif status == "no effect":
        assert notes and "has no effect in inferd" in notes[0], notes


@pytest.mark.parametrize(("flag", "refused"), [(f, r) for f, _, _, r in ROWS if r],
                         ids=[r[0] for r in ROWS if r[3]])
def test_the_refused_example_stops_the_start_naming_the_flag(tmp_path, capsys, flag, refused):
    with pytest.raises(SystemExit) as info:
        parse(tmp_path, refused)
    assert info.value.code != 0
    message = str(info.value.code) + capsys.readouterr().err
    assert flag in message, message


def test_vertex_ai_mode_in_the_environment_needs_allow_vertex_ai_false(tmp_path):
    with pytest.raises(SystemExit, match="AIP_MODE=PREDICTION.*--allow-vertex-ai=false"):
        parse(tmp_path, [], environ={"AIP_MODE": "PREDICTION"})
    assert parse(tmp_path, ["--allow-vertex-ai=false"], environ={"AIP_MODE": "PREDICTION"})


def test_the_metrics_address_defaults_to_the_http_address(tmp_path):
    assert parse(tmp_path, ["--http-address=127.0.0.1"]).metrics_address == "127.0.0.1"
    assert parse(tmp_path, ["--http-address=127.0.0.1", "--metrics-address=0.0.0.0"]).metrics_address == "0.0.0.0"
    assert parse(tmp_path, []).metrics_address == "0.0.0.0"


def test_values_reach_the_config(tmp_path):
    config = parse(tmp_path, ["--model-load-thread-count=2", "--host-policy=cpu,cpu-cores=0-1,3-3",
                              "--host-policy=pinned,numa-node=0", "--log-verbose=true",
                              "--repoagent-directory=/agents"])
    assert config.model_load_thread_count == 2 and config.log_verbose == 1
    assert config.host_policies == {"cpu": {"cpu-cores": "0-1,3-3"}, "pinned": {"numa-node": "0"}}
    assert config.repoagent_directory == "/agents"


@pytest.mark.parametrize(("value", "message"), [
    ("cpu", "--host-policy option format is '<policy name>,<setting>=<value>'. Got cpu"),
    ("cpu,cpu-cores=3", "host policy setting 'cpu-cores' format is '<lower_cpu_core_id>-<upper_cpu_core_id>'. "
                        "Got 3"),
    ("cpu,cpu-cores=a-b", "Parsing 'cpu-cores' value: Can't parse 'a' to integer"),
    ("cpu,numa-node=first", "Parsing 'numa-node' value: Can't parse 'first' to integer"),
    ("cpu,priority=1", "Unsupported host policy setting 'priority' is specified, supported settings are "
                       "'numa-node', 'cpu-cores'"),
])
def test_host_policy_values_are_refused_with_tritons_words(tmp_path, value, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        parse(tmp_path, ["--host-policy", value])
