#!/bin/bash
# bench/openai_ab.sh OLD NEW [PAIRS] [bench/openai_stream.py args...]
#
# bench/openai_stream.py against two commits of the server, in alternating order (OLD NEW, NEW OLD, ...), one
# round per run, so that both see the same moments of a shared host. Each commit's supervisor/, worker/ and
# envs/ are exported (git archive, plus this checkout's generated supervisor/_gen) to a directory put first on
# PYTHONPATH, which wins over the editable install; the server and its workers inherit it. The benchmark
# script itself is this checkout's. Default arguments: --ttft-only --latency-requests 100 (first tokens at
# c=1); give others after PAIRS (e.g. `-d 4` for the whole run, throughput included).
#
#   bench/openai_ab.sh 38af1f4 HEAD 4
#   bench/openai_ab.sh 38af1f4 HEAD 2 -d 4 --latency-requests 40
#
# Raw JSON per run in bench/out/openai-ab-<stamp>/, then the medians over runs per version.
set -eu
cd "$(dirname "$0")/.."
old=$(git rev-parse --short "$1"); new=$(git rev-parse --short "$2"); pairs=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
args=("$@"); [ ${#args[@]} -eq 0 ] && args=(--ttft-only --latency-requests 100)
out=bench/out/openai-ab-$(date -u +%Y%m%d-%H%M%S); mkdir -p "$out"
for c in "$old" "$new"; do
  rm -rf "$out/tree-$c" && mkdir -p "$out/tree-$c/inferd"
  git archive "$c" supervisor worker envs | tar -x -C "$out/tree-$c/inferd"
  cp -r supervisor/_gen "$out/tree-$c/inferd/supervisor/"
done
for r in $(seq 1 "$pairs"); do
  order="$old $new"; [ $((r % 2)) = 0 ] && order="$new $old"
  for c in $order; do
    PYTHONPATH="$PWD/$out/tree-$c" .venv/bin/python bench/openai_stream.py --rounds 1 --json "${args[@]}" \
      > "$out/$c-$r.json" 2> "$out/$c-$r.err"
    echo "$c pair $r done $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
.venv/bin/python - "$out" "$old" "$new" <<'EOF'
import glob, json, statistics, sys
out, versions = sys.argv[1], sys.argv[2:]
med = statistics.median
for v in versions:
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{v}-*.json"))]
    print(f"{v}: {len(runs)} runs (medians over the runs of each run's p50)")
    for conc, row in runs[0]["summary"]["throughput"].items():
        for kind in ("chat", "generate_stream"):
            tps = [r["summary"]["throughput"][conc][kind]["tokens_per_s"] for r in runs]
            cpu = [r["summary"]["throughput"][conc][kind]["server_cpu_us_per_token"] for r in runs]
            print(f"  c={conc:<3} {kind:16} {med(tps):>9,.0f} tokens/s  {med(cpu):5.1f} us/token")
    for kind in runs[0]["summary"]["latency"]:
        lat = [r["summary"]["latency"][kind] for r in runs]
        new_ = [r["summary"]["raw_client_c1"][kind] for r in runs]
        kept = [r["summary"]["raw_kept_c1"][kind] for r in runs]
        print(f"  {kind:16} TTFT added c=1: aiohttp {med(x['ttft_added_p50_ms_c1'] for x in lat):.3f} ms | bare, "
              f"new connection {med(x['ttft_added_p50_ms'] for x in new_):.3f} (connect "
              f"{med(x['connect_p50_ms'] for x in new_):.3f}) | bare, kept connection "
              f"{med(x['ttft_added_p50_ms'] for x in kept):.3f} (way in {med(x['way_in_p50_ms'] for x in kept):.3f}"
              f" + out {med(x['way_out_p50_ms'] for x in kept):.3f})")
EOF
