#!/usr/bin/env bash
# Compiles the sm_90a tree-verify attention kernel to a cubin, disassembles it (cuobjdump -sass) and fails when any
# instantiation of verify_attn_sm90_kernel (unplanned <false, *> / planned <true, *>, P as hi + lo <*, false> / as
# one bf16 <*, true>: p_precision DDT_ATTN_P_BF16) has more than MAX_R2UR R2UR
# instructions. An R2UR moves a value from an ordinary register into a uniform one; wgmma takes its shared-memory
# descriptors from uniform registers, so when ptxas cannot prove a descriptor's inputs warp-uniform it builds the
# descriptor per thread and moves it over with an R2UR pair before every wgmma (an HGMMA every ~8 instructions instead
# of ~3). The kernel stays correct and every test passes, only slower: docs/PERF_NOTES.md S44-S46 (the warpgroup and
# stage indices through lane-0 shuffles took the counts (unplanned / planned) from 463 / 148 to 53 / 61 and the
# calls 1-7% faster; S44's loop shape gave 537 / 543 without any source change in the narrow path it slowed).
# Usage: check_sm90_sass.sh NVCC SOURCE_ROOT CUOBJDUMP [MAX_R2UR]
set -euo pipefail
nvcc=$1
root=$2
cuobjdump=$3
max_r2ur=${4:-96}
if [ ! -x "$cuobjdump" ]; then
  echo "FAIL: no cuobjdump at '$cuobjdump' (deploy/install-deps.sh installs nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm into the venv)"
  exit 1
fi
# cuobjdump -sass runs nvdisasm: the one beside it first (the pip packages put both in nvidia/cu13/bin).
export PATH="$(dirname "$cuobjdump"):$PATH"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$nvcc" -std=c++20 -gencode=arch=compute_90a,code=sm_90a -O3 -I"$root/kernels/include" -I"$root" \
  -cubin "$root/kernels/cuda/verify_attn_sm90.cu" -o "$out/sm90.cubin" >"$out/nvcc.log" 2>&1 || {
  cat "$out/nvcc.log"
  echo "FAIL: the sm_90a kernel does not compile"
  exit 1
}
"$cuobjdump" -sass "$out/sm90.cubin" >"$out/sm90.sass" 2>"$out/cuobjdump.log" || {
  cat "$out/cuobjdump.log"
  echo "FAIL: $cuobjdump could not disassemble the cubin"
  exit 1
}
status=0
for inst in 0 1 0b 1b; do
  planned=${inst%b}
  pbf16=$([ "$inst" = "$planned" ] && echo 0 || echo 1)
  name=$([ $planned = 1 ] && echo planned || echo unplanned)$([ $pbf16 = 1 ] && echo ", bf16 P" || true)
  # The instantiation's listing: from its "Function :" header to the next one.
  awk -v k="verify_attn_sm90_kernelILb${planned}ELb${pbf16}E" '/Function : /{f = index($0, k) > 0} f' "$out/sm90.sass" \
    >"$out/k$inst.sass"
  hgmma=$(grep -c "HGMMA" "$out/k$inst.sass" || true)
  r2ur=$(grep -cw "R2UR" "$out/k$inst.sass" || true)  # (also a suffixed R2UR.xx form)
  if [ "$hgmma" -lt 100 ]; then  # (the kernel has >= 144 wgmmas; fewer means the listing was not found)
    echo "FAIL: $name instantiation: $hgmma HGMMA instructions in the listing (expected >= 100)"
    status=1
    continue
  fi
  echo "verify_attn_sm90_kernel ($name): $r2ur R2UR, $hgmma HGMMA (budget $max_r2ur R2UR)"
  if [ "$r2ur" -gt "$max_r2ur" ]; then
    echo "FAIL: $name instantiation: $r2ur R2UR above the budget: some wgmma descriptor is no longer warp-uniform"
    status=1
  fi
done
[ $status = 0 ] && echo "ok: the wgmma descriptors of every instantiation stay in uniform registers"
exit $status
