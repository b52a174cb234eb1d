#!/usr/bin/env bash
# Compiles the sm_90a tree-verify attention kernel with ptxas diagnostics and fails when ptxas reports that
# it serialized the kernel's wgmma instructions (C7514 / C7515 / C7518 ..., "wgmma.mma_async instructions are
# serialized": each wgmma then waits for the previous one; the kernel stays correct, every test passes, and
# the overlap is gone) or injected a wgmma wait of its own (C7517, "warpgroup.wait is injected": it awaits
# wgmmas the code meant to keep in flight), or when the kernel spills more than a small budget (stores or
# loads; spilled accumulator registers are one cause of the serialization), or when its static shared memory
# exceeds what the 227 KB budget leaves beside the dynamic part. Other C75xx notes are printed.
# docs/PERF_NOTES.md S9-S12. Usage: check_sm90_ptxas.sh NVCC SOURCE_ROOT [MAX_SPILL_BYTES]
set -euo pipefail
nvcc=$1
root=$2
max_spill=${3:-128}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
log="$out/ptxas.log"
"$nvcc" -std=c++20 -gencode=arch=compute_90a,code=sm_90a -O3 -I"$root/kernels/include" -I"$root" \
  -c "$root/kernels/cuda/verify_attn_sm90.cu" -o "$out/sm90.o" -Xptxas -v >"$log" 2>&1 || {
  cat "$log"
  echo "FAIL: the sm_90a kernel does not compile"
  exit 1
}
status=0
grep "(C75[0-9][0-9])" "$log" | sed 's/ in the function.*//' || true
if grep -q "instructions are serialized" "$log"; then
  echo "FAIL: ptxas serialized the sm_90a kernel's wgmma instructions"
  status=1
fi
if grep -q "warpgroup.wait is injected" "$log"; then
  echo "FAIL: ptxas injected a wgmma wait into the sm_90a kernel"
  status=1
fi
# The attention kernel's entries (both instantiations: unplanned and planned calls; the larger of their numbers;
# the combine and plan kernels in the same file spill nothing).
props=$(grep -A2 "Function properties for .*verify_attn_sm90_kernel" "$log" || true)
stores=$(echo "$props" | grep -o "[0-9]* bytes spill stores" | grep -o "^[0-9]*" | sort -n | tail -n 1 || true)
loads=$(echo "$props" | grep -o "[0-9]* bytes spill loads" | grep -o "^[0-9]*" | sort -n | tail -n 1 || true)
if [ -z "$stores" ] || [ -z "$loads" ]; then
  cat "$log"
  echo "FAIL: no ptxas resource line for verify_attn_sm90_kernel"
  exit 1
fi
echo "verify_attn_sm90_kernel: $stores bytes of spill stores, $loads of spill loads (budget $max_spill each)"
if [ "$stores" -gt "$max_spill" ] || [ "$loads" -gt "$max_spill" ]; then
  echo "FAIL: spills above the budget"
  status=1
fi
# Static shared memory: the kernel's dynamic 230,400 bytes (kSmemBytes) + static must stay within the 227 KB
# (232,448 B) a CTA may have, i.e. static <= 2,048 (kSmemStaticBound); past it the launcher's shared-memory
# opt-in fails at run time, so catch it here.
smem=$(echo "$props" | grep -o "[0-9]* bytes smem" | grep -o "^[0-9]*" | sort -n | tail -n 1 || true)
max_static=2048
echo "verify_attn_sm90_kernel: ${smem:-?} bytes of static shared memory (bound $max_static)"
if [ -z "$smem" ] || [ "$smem" -gt "$max_static" ]; then
  echo "FAIL: static shared memory above kSmemStaticBound (or not reported)"
  status=1
fi
[ "$status" = 0 ] && echo "ok: no serialized wgmma, no injected wait, spills within budget, static shared memory within bound"
exit $status
