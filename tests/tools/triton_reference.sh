#!/usr/bin/env bash
# Copied from the workplace tool /work/shared/tools/triton_reference.sh (the project must not depend on /work/shared);
# tests/conftest.py (TRITON_SCRIPT) and .ci/run use this copy. Keep the two in step by hand.
# Runs NVIDIA Triton Inference Server 2.51 (Python backend only, CPU) on this machine, for side-by-side
# behaviour checks and benchmarks. The binary comes from the nvidia-pytriton 0.7.0 wheel on PyPI, which
# ships tritonserver, its Python backend and stubs for Python 3.8-3.12. No ONNX Runtime or PyTorch backend.
#
#   triton_reference.sh setup                 # once: venv + wheel (about 1 minute)
#   triton_reference.sh ready                 # exit status 0 when setup has been done
#   triton_reference.sh run --model-repository DIR --http-port 18400 --grpc-port 18401 --metrics-port 18402
#
# State lives in $TRITON_REF_DIR (default ~/.cache/triton-reference). Notes:
# - The stub runs on Python 3.11 here; numpy < 2 is installed for it (its BYTES path breaks on numpy 2).
# - This version predates --allow-client-shm (client shared memory is on by default).
# - A model with EXECUTION_ENV_PATH needs a stub of the env's Python next to its config.pbtxt:
#   copy python_backend_stubs/<X.Y>/triton_python_backend_stub from the wheel (see `where`).
set -eu
DIR=${TRITON_REF_DIR:-$HOME/.cache/triton-reference}
PY=${TRITON_REF_PYTHON:-python3.11}
site() { "$DIR/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
case "${1:-}" in
  setup)
    "$PY" -m venv "$DIR/venv"
    "$DIR/venv/bin/pip" install -q "nvidia-pytriton==0.7.0" "numpy<2"
    S=$(site)
    chmod -R u+rwX "$S/pytriton/tritonserver"
    find "$S/pytriton/tritonserver" -name triton_python_backend_stub -exec chmod 755 {} +
    PYV=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    cp "$S/pytriton/tritonserver/python_backend_stubs/$PYV/triton_python_backend_stub" "$S/pytriton/tritonserver/backends/python/"
    chmod 755 "$S/pytriton/tritonserver/bin/tritonserver"
    echo "ready: $0 run --model-repository DIR ..."
    ;;
  ready)
    [ -x "$DIR/venv/bin/python" ] && [ -x "$(site)/pytriton/tritonserver/bin/tritonserver" ]
    ;;
  where)
    echo "$(site)/pytriton/tritonserver"
    ;;
  run)
    shift
    S=$(site)
    LIBPY=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
    export PATH="$DIR/venv/bin:$PATH"
    export LD_LIBRARY_PATH="$LIBPY:$S/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    exec "$S/pytriton/tritonserver/bin/tritonserver" --backend-directory "$S/pytriton/tritonserver/backends" "$@"
    ;;
  *) sed -n '4,16p' "$0"; exit 2 ;;
esac
