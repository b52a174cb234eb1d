#!/usr/bin/env bash
# Compiles the portable tree-verify attention kernel (kernels/cuda/verify_attn_portable.cu) for the smallest and
# the largest targets it promises (sm_80, sm_120; sm_120 allows 99 KB of shared memory per CTA) and for sm_90a, where
# the narrow-8 instantiation runs two CTAs per SM, with ptxas diagnostics and fails when:
#  - the wide-only kernel (verify_attn_portable_kernel<kWideOnly = 0, *>, every tree batch; * = P as hi + lo or, for
#    p_precision DDT_ATTN_P_BF16, as one bf16) spills at all (it runs at 224-233 registers with none: docs/PERF_NOTES.md
#    S39), the narrow-16 one (<1, *>) spills more than a budget (its 12-56 B lie outside the tile loops; a larger
#    number is a new spill to look at), or the narrow-8 one (<2, *>, 128 registers for two CTAs per SM: S81) more than
#    its own (36-40 B on sm_90a, outside the tile loop);
#  - any kernel's static shared memory exceeds kSmemStatic (384 B), which the dynamic part's static_assert
#    assumes on the 99 KB targets (past it the launcher's shared-memory opt-in fails at run time).
# Usage: check_portable_ptxas.sh NVCC SOURCE_ROOT [MAX_NARROW_SPILL_BYTES [MAX_NARROW8_SPILL_BYTES]]
set -euo pipefail
nvcc=$1
root=$2
max_narrow_spill=${3:-96}
max_narrow8_spill=${4:-96}
max_static=384
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for arch in 80 90a 120; do
  log="$out/ptxas_$arch.log"
  "$nvcc" -std=c++20 -gencode=arch=compute_$arch,code=sm_$arch -O3 -I"$root/kernels/include" -I"$root" \
    -c "$root/kernels/cuda/verify_attn_portable.cu" -o "$out/portable_$arch.o" -Xptxas -v >"$log" 2>&1 || {
    cat "$log"
    echo "FAIL: the portable kernel does not compile for sm_$arch"
    exit 1
  }
  for kind in 0 1 2 0b 1b 2b; do
    inst=${kind%b}
    pbf16=$([ "$kind" = "$inst" ] && echo 0 || echo 1)
    props=$(grep -A2 "Function properties for .*verify_attn_portable_kernelILi${inst}ELb${pbf16}E" "$log" || true)
    stores=$(echo "$props" | grep -o "[0-9]* bytes spill stores" | grep -o "^[0-9]*" | head -n 1 || true)
    loads=$(echo "$props" | grep -o "[0-9]* bytes spill loads" | grep -o "^[0-9]*" | head -n 1 || true)
    smem=$(echo "$props" | grep -o "[0-9]* bytes smem" | grep -o "^[0-9]*" | head -n 1 || true)
    if [ -z "$stores" ] || [ -z "$loads" ] || [ -z "$smem" ]; then
      cat "$log"
      echo "FAIL: no ptxas resource line for verify_attn_portable_kernel<$inst, $([ $pbf16 = 1 ] && echo true || echo false)>"
      exit 1
    fi
    case $inst in
      0) budget=0 name="wide-only" ;;
      1) budget=$max_narrow_spill name="narrow-16" ;;
      *) budget=$max_narrow8_spill name="narrow-8" ;;
    esac
    name="$name$([ $pbf16 = 1 ] && echo ", bf16 P" || true)"
    echo "sm_$arch, kernel $name: $stores / $loads bytes of spill stores / loads (budget $budget), $smem bytes of static shared memory (bound $max_static)"
    if [ "$stores" -gt "$budget" ] || [ "$loads" -gt "$budget" ]; then
      echo "FAIL: spills above the budget"
      status=1
    fi
    if [ "$smem" -gt "$max_static" ]; then
      echo "FAIL: static shared memory above kSmemStatic"
      status=1
    fi
  done
done
[ "$status" = 0 ] && echo "ok: the portable kernel compiles for sm_80, sm_90a and sm_120 within its spill and shared-memory bounds"
exit $status
