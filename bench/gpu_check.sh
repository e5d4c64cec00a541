#!/usr/bin/env bash
# Every GPU check of inferd in one offline run (under 8 minutes): `make test-gpu` (tests/gpu) and the GPU
# benchmarks, on a fresh GPU host whose python3.12 already has torch (CUDA), cupy, cuda-bindings, numpy,
# grpcio, protobuf, uvloop, psutil and pytest, plus a folder of the remaining wheels filled by
# bench/gpu_wheels.sh (pyzmq, httptools, orjson, hpack, tritonclient and its deps, grpcio and protobuf at
# constraints.txt's pins, grpcio-tools).
#
#   bench/gpu_check.sh                  # wheels in ./.whl; results in $OUT if set, else bench/out/gpu-check-<stamp>
#   WHEELS=/path/to/whl PYTHON=python3.12 bench/gpu_check.sh
#
# It makes .gpu-venv (a venv over the system site-packages, so the host's torch/cupy/cuda-bindings are used),
# installs the wheels into it with no index, installs inferd editable (or, without setuptools, puts the
# source tree on the venv's path and writes the console scripts), generates the protos, then runs the
# checks. Outputs: env.txt, test-gpu.log (+ junit xml), gpu_ipc.json / gpu_ipc.txt, summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT_DIR=${OUT:-$ROOT/bench/out/gpu-check-$(date +%Y%m%d-%H%M%S)}
WHEELS=${WHEELS:-$ROOT/.whl}
PY=${PYTHON:-python3.12}
VENV=$ROOT/.gpu-venv
mkdir -p "$OUT_DIR"
START=$(date +%s)
status=0
note() { echo "[gpu_check +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT_DIR/summary.txt"; }

# ---- environment (about 30 s) ----
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV" || { note "cannot create $VENV with $PY"; exit 1; }
fi
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --find-links "$WHEELS" "$WHEELS"/*.whl \
    || note "some wheels in $WHEELS did not install"
else
  note "no wheels in $WHEELS (run bench/gpu_wheels.sh first, where an index is reachable); using what the host has"
fi
if ! "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>"$OUT_DIR/pip-e.log"; then
  # no setuptools on the host: the same package mapping by hand (inferd.{supervisor,worker,envs,pytriton} -> the folders)
  note "editable install unavailable (see pip-e.log): source tree on the path instead"
  SHIM=$ROOT/.gpu-shim
  mkdir -p "$SHIM/inferd"
  for pkg in supervisor worker envs pytriton; do ln -sfn "$ROOT/$pkg" "$SHIM/inferd/$pkg"; done
  SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$SHIM" > "$SITE/inferd-gpu-shim.pth"
  for script in "inferd:inferd.supervisor.main" "infer-ctl:inferd.supervisor.ctl.main"; do
    printf '#!%s\nimport sys\nfrom %s import main\nsys.exit(main())\n' "$VENV/bin/python" "${script#*:}" \
      > "$VENV/bin/${script%%:*}"
    chmod +x "$VENV/bin/${script%%:*}"
  done
fi
"$VENV/bin/python" protos/generate.py >/dev/null || { note "protos/generate.py failed (grpcio-tools missing?)"; exit 1; }
touch "$VENV/.installed"  # make test-gpu VENV=.gpu-venv: the environment is ready, do not pip install again
{
  nvidia-smi || echo "nvidia-smi failed"
  "$VENV/bin/python" - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "cupy", "cuda.bindings", "onnxruntime", "tensorrt", "zmq", "tritonclient"):
    try:
        mod = importlib.import_module(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as exc:
        print(name, "missing:", exc)
try:
    import torch
    print("torch cuda:", torch.cuda.is_available(), torch.version.cuda,
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception as exc:
    print("torch cuda check failed:", exc)
from inferd.worker.wire import cuda_ipc
print("cuda_ipc backend:", cuda_ipc.backend_name() or "none", "available:", cuda_ipc.available())
EOF
} >"$OUT_DIR/env.txt" 2>&1
note "environment ready: $(grep -m1 'cuda_ipc backend' "$OUT_DIR/env.txt")"

# ---- make test-gpu (budget 300 s) ----
timeout 300 make test-gpu VENV="$VENV" PYTHON="$PY" \
  >"$OUT_DIR/test-gpu.log" 2>&1
rc=$?
note "make test-gpu: exit $rc ($(tail -n 1 "$OUT_DIR/test-gpu.log"))"
[ $rc -eq 0 ] || status=1
grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT_DIR/test-gpu.log" | head -40 >>"$OUT_DIR/summary.txt" || true

# ---- benchmarks (budget 150 s) ----
timeout 120 "$VENV/bin/python" bench/gpu_ipc.py --json >"$OUT_DIR/gpu_ipc.json" 2>"$OUT_DIR/gpu_ipc.err"
rc=$?
if [ $rc -eq 0 ]; then
  "$VENV/bin/python" - "$OUT_DIR/gpu_ipc.json" >"$OUT_DIR/gpu_ipc.txt" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("%d MiB on %s: device p50 %.3f ms (first %.2f ms), host p50 %.2f ms, speedup %.1fx; targets: >=10x %s, <1 ms %s" % (
    r["mib"], r["gpu"], r["paths"]["device"]["p50_ms"], r["paths"]["device"]["first_ms"], r["paths"]["host"]["p50_ms"],
    r["speedup_p50"], r["target_speedup_met"], r["target_under_1ms_met"]))
EOF
  note "gpu_ipc: $(cat "$OUT_DIR/gpu_ipc.txt")"
else
  note "bench/gpu_ipc.py failed (exit $rc): $(tail -n 3 "$OUT_DIR/gpu_ipc.err" | tr '\n' ' ')"
  status=1
fi

# ---- [gpu-cudashm] client CUDA shared memory benchmark (issue 22): bench/gpu_cuda_shm.py goes here ----
if [ -f bench/gpu_cuda_shm.py ]; then
  timeout 90 "$VENV/bin/python" bench/gpu_cuda_shm.py --json >"$OUT_DIR/gpu_cuda_shm.json" 2>"$OUT_DIR/gpu_cuda_shm.err"
  rc=$?
  note "gpu_cuda_shm: exit $rc"
  [ $rc -eq 0 ] || status=1
fi

note "done in $(( $(date +%s) - START )) s, status $status; results in $OUT_DIR"
exit $status
