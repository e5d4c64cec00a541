#!/usr/bin/env bash
# Builds Triton's checksum repository agent (triton-inference-server/checksum_repository_agent) for the
# reference Triton 2.51 of triton_reference.sh, whose wheel ships no repository agents, so that
# tests/e2e/test_repository_agents.py can run its checksum cases against the real Triton too
# (INFERD_E2E_TARGET=triton; they skip there without it).
#
#   checksum_agent.sh build [AGENT_SRC CORE_SRC]   # needs g++ and OpenSSL's headers (libssl-dev)
#   checksum_agent.sh where                        # the --repoagent-directory holding it
#
# Without sources it clones the agent (main) and Triton's core (r24.10, for the headers) from GitHub.
# The library lands in $TRITON_REF_DIR/repoagents/checksum/libtritonrepoagent_checksum.so.
set -eu
DIR=${TRITON_REF_DIR:-$HOME/.cache/triton-reference}
OUT="$DIR/repoagents"
case "${1:-}" in
  build)
    AGENT_SRC=${2:-}
    CORE_SRC=${3:-}
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    if [ -z "$AGENT_SRC" ]; then
      git clone -q --depth 1 https://github.com/triton-inference-server/checksum_repository_agent "$WORK/agent"
      AGENT_SRC="$WORK/agent"
    fi
    if [ -z "$CORE_SRC" ]; then
      git clone -q --depth 1 --branch r24.10 https://github.com/triton-inference-server/core "$WORK/core"
      CORE_SRC="$WORK/core"
    fi
    mkdir -p "$OUT/checksum"
    # the agent's symbols (TRITONREPOAGENT_*, TRITONSERVER_Error*) resolve against tritonserver at dlopen
    g++ -std=c++17 -O2 -shared -fPIC -I"$CORE_SRC/include" "$AGENT_SRC/src/checksum.cc" \
      -o "$OUT/checksum/libtritonrepoagent_checksum.so" -lcrypto
    echo "built: $OUT/checksum/libtritonrepoagent_checksum.so"
    ;;
  where)
    echo "$OUT"
    ;;
  *) sed -n '2,11p' "$0"; exit 2 ;;
esac
