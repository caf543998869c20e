#!/usr/bin/env bash
# Brings a fresh machine to a built ember: system packages, the venv with
# pinned requirements, the CMake build (ninja + ccache) and the editable
# install of torch_ember. Every step is skipped when already done, so this is
# cheap to run before each make target.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
VENV=.venv
BUILD=build

need_apt=()
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v ccache >/dev/null || need_apt+=(ccache)
[ -f /usr/include/numa.h ] || need_apt+=(libnuma-dev)
[ -d /usr/src/googletest ] || [ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
command -v cmake >/dev/null || need_apt+=(cmake)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] installing system packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

req_hash=$(sha256sum requirements-dev.txt | cut -c1-16)
if [ ! -f "$VENV/.req-$req_hash" ]; then
  echo "[setup] creating venv and installing requirements-dev.txt"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q -r requirements-dev.txt
  rm -f "$VENV"/.req-*
  touch "$VENV/.req-$req_hash"
fi

if [ ! -f "$BUILD/build.ninja" ]; then
  echo "[setup] configuring CMake build in $BUILD/"
  cmake -S . -B "$BUILD" -G Ninja \
    -DPython3_EXECUTABLE="$PWD/$VENV/bin/python" \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
fi
echo "[setup] building"
cmake --build "$BUILD" -j"$(nproc)"

if [ ! -f "$VENV/.editable-installed" ]; then
  echo "[setup] installing torch_ember (editable, no build isolation)"
  "$VENV/bin/pip" install -q --no-build-isolation --no-deps -e .
  touch "$VENV/.editable-installed"
fi
