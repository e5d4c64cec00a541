#!/usr/bin/env bash
# The wheels bench/gpu_check.sh installs on a GPU host that has no package index, for CPython 3.12 on
# x86-64 Linux, downloaded here into DIR (default .whl; add `/.whl/` to .git/info/exclude and name `.whl`
# and `supervisor/_gen` in the device run's carry). The host already has torch (CUDA), cupy, cuda-bindings,
# nvidia-ml-py, numpy, psutil, uvloop, pytest, prometheus-client and httpx (its cuda-bindings is left alone:
# it matches the host's driver). grpcio and protobuf are fetched at constraints.txt's pins anyway, because the
# generated gRPC modules refuse an older runtime than the one they were generated for.
#
#   bench/gpu_wheels.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
mkdir -p "$DIR"
pin() {  # the constraints.txt version of a package, if pinned there
  local v; v=$(grep -i -m1 "^$1==" constraints.txt | cut -d= -f3 || true)
  if [ -n "$v" ]; then echo "$1==$v"; else echo "$1"; fi
}
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform any)
for p in "$(pin pyzmq)" "$(pin httptools)" "$(pin orjson)" "$(pin hpack)" "$(pin grpcio)" "$(pin grpcio-tools)" \
         "$(pin protobuf)" "tritonclient==2.60.0" python-rapidjson geventhttpclient gevent greenlet zope.event \
         zope.interface brotli; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
    -d "$DIR" "$p"
done
ls "$DIR"; du -sh "$DIR"
