#!/usr/bin/env bash
# Builds the GPU binaries here (nvcc, sm_90a) and copies them into .gpu-carry/ for `device run --carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target ddtree_kernels test_kernels_gpu bench_kernels ddtree-demo
# Tree-verify attention (issue 5): GPU tests vs the CPU twin and the benchmark of the oracle.
cmake --build "$build" -j "$(nproc)" --target test_verify_attn_gpu bench_verify_attn
rm -rf .gpu-carry && mkdir -p .gpu-carry/lib
cp "$build"/lib/libddtree_kernels.so .gpu-carry/lib/
cp "$build"/tests/gpu/test_kernels_gpu "$build"/bench/bench_kernels "$build"/bin/ddtree-demo .gpu-carry/
cp "$build"/tests/gpu/test_verify_attn_gpu "$build"/bench/bench_verify_attn .gpu-carry/
du -sh .gpu-carry
