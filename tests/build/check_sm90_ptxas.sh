#!/usr/bin/env bash
# Compiles the sm_90a tree-verify attention kernel with ptxas diagnostics and fails when ptxas reports that
# it serialized the kernel's wgmma instructions (message C7510-C7520, "wgmma.mma_async instructions are
# serialized": each wgmma then waits for the previous one; the kernel stays correct but runs 2-3x slower,
# docs/PERF_NOTES.md S10) or when the kernel spills more than a small budget (spills of accumulator registers
# are one cause of that serialization). Usage: check_sm90_ptxas.sh NVCC SOURCE_ROOT [MAX_SPILL_BYTES]
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
if grep -q "instructions are serialized" "$log"; then
  grep "instructions are serialized" "$log" | sed 's/ in the function.*//'
  echo "FAIL: ptxas serialized the sm_90a kernel's wgmma instructions"
  status=1
fi
# The attention kernel's entry (the combine kernel in the same file spills nothing).
spill=$(grep -A2 "verify_attn_sm90_kernel" "$log" | grep -o "[0-9]* bytes spill stores" | head -n 1 | grep -o "^[0-9]*" || true)
if [ -z "$spill" ]; then
  cat "$log"
  echo "FAIL: no ptxas resource line for verify_attn_sm90_kernel"
  exit 1
fi
echo "verify_attn_sm90_kernel: $spill bytes of spill stores (budget $max_spill)"
if [ "$spill" -gt "$max_spill" ]; then
  echo "FAIL: spills above the budget"
  status=1
fi
[ "$status" = 0 ] && echo "ok: no serialized wgmma, spills within budget"
exit $status
