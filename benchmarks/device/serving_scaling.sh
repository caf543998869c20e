#!/usr/bin/env bash
# Serving throughput past 2 cores (issue 11), on a lent 16-core machine
# (the `device` tool; never CI). That machine has Python 3.12 with torch
# 2.11 and nothing to install from, so this builds ember against its torch
# after applying torch-2.11.patch (no accelerator-graph registry and no
# PrivateUse1 profiler there: both left out of that build, so serving.py
# --graphs cannot run there). Writes
# serving_*.md/json and build.log under $OUT (or ./device-out).
#
#   run: [CORES="all 2 4"] [MODELS="bert-tiny bert-base"] bash benchmarks/device/serving_scaling.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
PY=$(command -v python3)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TORCH_CUDA_ARCH_LIST=9.0

"$PY" --version; nproc
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA|L3" | tee "$OUT/cpu.txt"
git apply benchmarks/device/torch-2.11.patch || patch -p1 < benchmarks/device/torch-2.11.patch || exit 1
start=$(date +%s)
# -O2 as the default build, without -g (compile time on a leased machine).
# libnuma: that image has none; carried as Debian's libnuma1/libnuma-dev
# unpacked under .devdeps/numa (`carry`). No GoogleTest there either.
NUMA=$PWD/.devdeps/numa/usr
export LD_LIBRARY_PATH=$NUMA/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
cmake -S . -B build-device -G Ninja -DPython3_EXECUTABLE="$PY" -DEMBER_BUILD_TESTS=OFF \
  -DCUDA_TOOLKIT_ROOT_DIR="${CUDA_HOME:-/usr/local/cuda}" \
  -DNUMA_LIB="$NUMA/lib/x86_64-linux-gnu/libnuma.so" -DNUMA_INCLUDE_DIR="$NUMA/include" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" >"$OUT/build.log" 2>&1 &&
  cmake --build build-device -j"$(nproc)" --target _C >>"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(($(date +%s) - start)) s"
export PYTHONPATH=$PWD
"$PY" -c "import torch, torch_ember; x = torch.randn(64, 64); print(torch.__version__, torch.ember.device_count(), ((x.to('ember') @ x.to('ember')).cpu() - x @ x).abs().max().item())" || exit 1

# CORES="2 4 8": for each n, n devices x 1 core against one n-core device
# (the issue's 2-core target, and how it scales), the process held to n CPUs
# on distinct physical cores by taskset. "all": every CPU, one replica per CPU.
MODELS=${MODELS:-bert-tiny bert-base}
for n in ${CORES:-all 2 4}; do
  if [ "$n" = all ]; then
    "$PY" benchmarks/serving.py --models $MODELS --replicas "$(nproc)" \
      --out "$OUT/serving_all.md" --json "$OUT/serving_all.json"
    continue
  fi
  cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | head -"$n" | cut -d, -f1 | paste -sd,)
  echo "$n-core partition: CPUs $cpus"
  taskset -c "$cpus" "$PY" benchmarks/serving.py --models $MODELS --replicas "$n" \
    --out "$OUT/serving_$n.md" --json "$OUT/serving_$n.json"
done
