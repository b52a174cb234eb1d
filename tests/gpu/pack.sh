#!/usr/bin/env bash
# Builds the GPU binaries here (nvcc, sm_90a) and copies them into .gpu-carry/ for `device run --carry`
# (then tests/gpu/run.sh there; tests/gpu/ab.sh for a same-run A/B against BASE_LIB).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target ddtree_kernels test_kernels_gpu test_fast_math_gpu bench_kernels ddtree-demo
# Tree-verify attention (issue 5): GPU tests vs the CPU twin and the benchmark of the oracle.
cmake --build "$build" -j "$(nproc)" --target test_verify_attn_gpu bench_verify_attn
rm -rf .gpu-carry && mkdir -p .gpu-carry/lib
cp "$build"/lib/libddtree_kernels.so .gpu-carry/lib/
cp "$build"/tests/gpu/test_kernels_gpu "$build"/tests/gpu/test_fast_math_gpu "$build"/bench/bench_kernels \
  "$build"/bin/ddtree-demo .gpu-carry/
cp "$build"/tests/gpu/test_verify_attn_gpu "$build"/bench/bench_verify_attn .gpu-carry/
# Dev harnesses (bench/dev/tree_profile.cu, attn_profile.cu: per-stage clock64 profiles; wgmma_rate.cu: the attention
# kernel's wgmma shapes timed alone; smid_probe.cu: which SM each CTA of a one-CTA-per-SM grid lands on), when PROFILE=1.
if [ "${PROFILE:-0}" = 1 ]; then
  nvcc -std=c++20 -arch=sm_90a -O3 -Ikernels/include -I. bench/dev/tree_profile.cu kernels/common/validate.cpp \
    kernels/cpu/topk_cpu.cpp kernels/cpu/tree_build_cpu.cpp -o .gpu-carry/tree_profile
  nvcc -std=c++20 -arch=sm_90a -O3 -Ikernels/include -I. bench/dev/attn_profile.cu kernels/common/validate.cpp \
    kernels/common/verify_attn_split.cpp -o .gpu-carry/attn_profile
  nvcc -std=c++20 -arch=sm_90a -O2 bench/dev/smid_probe.cu -o .gpu-carry/smid_probe
  nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -O3 -I. bench/dev/wgmma_rate.cu -o .gpu-carry/wgmma_rate
  nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -O3 -DATTN_PROFILE_SM90 -Ikernels/include -I. \
    bench/dev/attn_profile.cu kernels/common/validate.cpp kernels/common/verify_attn_split.cpp -o .gpu-carry/attn_profile_sm90
fi
# A base library for tests/gpu/ab.sh (BASE_LIB=<dir holding libddtree_kernels.so>, e.g. another commit's build).
if [ -n "${BASE_LIB:-}" ]; then
  mkdir -p .gpu-carry/base/lib
  cp "$BASE_LIB"/libddtree_kernels.so .gpu-carry/base/lib/
fi
# Variant libraries for tests/gpu/ab.sh, timed beside base and new (VARIANTS="name=<dir holding
# libddtree_kernels.so> ...", e.g. other branches' builds; names: letters, digits, - and _, not base or new; paths
# without spaces). Each adds ~8 MB to .gpu-carry (the device's carry limit is 64 MiB: about 4 variants).
for v in ${VARIANTS:-}; do
  case $v in *=*) ;; *) echo "variant without name=dir: $v"; exit 2 ;; esac
  name=${v%%=*}
  dir=${v#*=}
  case $name in *[!A-Za-z0-9_-]*|""|base|new) echo "bad variant name: $name"; exit 2 ;; esac
  mkdir -p ".gpu-carry/variants/$name/lib"
  cp "$dir"/libddtree_kernels.so ".gpu-carry/variants/$name/lib/"
done
du -sh .gpu-carry
