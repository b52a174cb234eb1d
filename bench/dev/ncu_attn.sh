#!/usr/bin/env bash
# Dev (not a test): the tree-verify attention kernels under Nsight Compute's hardware counters and
# compute-sanitizer's memory checker, on the GPU machine (its Firecracker runtime runs both:
# .library/device/KINDS.md). Expects .gpu-carry from tests/gpu/pack.sh. Usage there:
#   [NCU_SHAPES="P,T,batch ..."] [BYTES_SHAPES="P,T,batch ..."] [SKIP_NCU=1] [SKIP_BYTES=1] [SKIP_MEMCHECK=1] \
#     [NCU_LIBS="new base <variant> ..."] [NCU_ARGS="--plan ..."] [NCU_KERNEL=regex] [NCU_CACHE=all|none] \
#     [BYTES_LAUNCHES=N] [NCU_TIMEOUT=s] [MEMCHECK_TIMEOUT=s] \
#     bench/dev/ncu_attn.sh
# Both ncu parts profile, for each library of NCU_LIBS (default new; base and variants as ab.sh packs them), the
# kernels whose mangled name NCU_KERNEL matches (default the sm_90a main kernel, whose first launch is the unplanned
# instantiation: the same tile loop as the planned one; verify_attn_sm90_kernelILb1ELb0E is the planned hi + lo one,
# with NCU_ARGS=--plan) in bench_verify_attn --sm90-only NCU_ARGS --shape P,T,batch, each launch alone and from cold
# caches (NCU_CACHE=none: as the kernels before left them, e.g. a combine's partials in L2). ncu: the first such
# launch, clocks left alone (--clock-control none, METHOD.md); full reports in $OUT/ncu_<lib>_<shape>.txt, the
# headline metrics printed. bytes: the same kernel's DRAM reads and writes and L2 read and write sectors (all
# sources), against the call's KV bytes (batch x (P + T) x 1,152 B): whether the row tiles of one request (T x H > 64
# rows) share each KV tile's DRAM read through L2 (the issue's "tiles that share a KV chunk share its load"), medians
# of BYTES_LAUNCHES (default 1) launches. memcheck: the attention GPU tests that feed bad pages, bad indices, NaN
# scores, too wide trees, stale and refused plans and host errors, under compute-sanitizer (a fault or an
# out-of-bounds access fails the run: --error-exitcode). Writes under $OUT (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
c=$PWD/.gpu-carry
export LD_LIBRARY_PATH=$c/lib:${LD_LIBRARY_PATH:-}
export DDTREE_KERNELS_LIB=$c/lib/libddtree_kernels.so
start=$(date +%s)
. "$PWD/tests/gpu/carry_lib.sh"  # libdir <base | new | variant>
# ncu on one library's kernels: ncu_lib <lib> <more ncu options> <program and its arguments>
ncu_lib() {
  local ld; ld=$(libdir "$1"); shift
  LD_LIBRARY_PATH=$ld DDTREE_KERNELS_LIB=$ld/libddtree_kernels.so timeout "${NCU_TIMEOUT:-150}" ncu \
    --clock-control none --cache-control "${NCU_CACHE:-all}" --kernel-name-base mangled --kernel-name "regex:${NCU_KERNEL:-verify_attn_sm90_kernel}" "$@"
}
if [ "${SKIP_NCU:-0}" != 1 ]; then
  for lib in ${NCU_LIBS:-new}; do
    for shape in ${NCU_SHAPES:-32768,16,32 32768,8,1 32768,1,32}; do
      f="$out/ncu_${lib}_${shape//,/_}.txt"
      ncu_lib "$lib" --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats --section InstructionStats \
        --print-details all "$c/bench_verify_attn" --sm90-only ${NCU_ARGS:-} --shape "$shape" > "$f" 2>&1
      echo "== ncu $lib $shape: exit $? at $(( $(date +%s) - start )) s"
      grep -E "^ +(Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit Rate|L2 Hit Rate|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued Instruction|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Stall [A-Za-z ]+|Max Bandwidth|Mem Busy|L2 Compression)" "$f" | head -60
    done
  done
fi
if [ "${SKIP_BYTES:-0}" != 1 ]; then
  echo "| lib | shape | launches | kernel us (min-max) | KV MB | DRAM read MB | DRAM read / KV | DRAM write MB | L2 reads MB | L2 reads / KV | L2 writes MB |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  for lib in ${NCU_LIBS:-new}; do
    for shape in ${BYTES_SHAPES:-32768,16,32 32768,64,32 2048,64,64 2048,128,64 32768,64,1}; do
      f="$out/bytes_${lib}_${shape//,/_}.csv"
      ncu_lib "$lib" --launch-count "${BYTES_LAUNCHES:-1}" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum \
        --csv --print-units base "$c/bench_verify_attn" --sm90-only ${NCU_ARGS:-} --shape "$shape" > "$f" 2>&1
      python3 - "$lib" "$shape" "$f" <<'PY'
import csv, statistics, sys
from collections import defaultdict
lib, shape, path = sys.argv[1], sys.argv[2], sys.argv[3]
P, T, b = (int(x) for x in shape.split(","))
names = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sectors_op_read.sum",
         "lts__t_sectors_op_write.sum")
vals = defaultdict(list)  # metric -> one value per profiled launch
kernels = set()  # (a median over launches of different kernels would mean nothing: NCU_KERNEL must pick one)
with open(path) as fh:
    for r in csv.reader(fh):
        if len(r) > 4 and r[-3] in names:
            try:
                vals[r[-3]].append(float(r[-1].replace(",", "")))
            except ValueError:  # (n/a)
                continue
            kernels.add(r[4])
if len(vals) < len(names):
    print(f"| {lib} | {shape} | (ncu gave no metrics: see {path}) |")
    sys.exit(0)
if len(kernels) > 1:
    print(f"| {lib} | {shape} | ({len(kernels)} different kernels matched NCU_KERNEL: narrow it; see {path}) |")
    sys.exit(0)
med = {k: statistics.median(v) for k, v in vals.items()}
us = [t / 1e3 for t in vals["gpu__time_duration.sum"]]
kv = b * (P + T) * 1152 / 1e6
rd, wr = med["dram__bytes_read.sum"] / 1e6, med["dram__bytes_write.sum"] / 1e6
l2r, l2w = med["lts__t_sectors_op_read.sum"] * 32 / 1e6, med["lts__t_sectors_op_write.sum"] * 32 / 1e6
label = f"{P // 1024 if P >= 1024 else P}{'k' if P >= 1024 else ''} T {T} b {b}"
print(f"| {lib} | {label} | {len(us)} | {statistics.median(us):.1f} ({min(us):.1f}-{max(us):.1f}) | {kv:.0f} | {rd:.1f} | "
      f"{rd / kv:.2f} | {wr:.2f} | {l2r:.1f} | {l2r / kv:.2f} | {l2w:.2f} |")
PY
    done
  done
fi
if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
  filter='VerifyAttnGpu.BadIndicesPoisonOnlyTheirRequest:VerifyAttnGpu.TreeWiderThanVisWordsPoisonsAllItsRows:VerifyAttnGpu.BadPageInOneSplitPoisonsTheWholeRequest:VerifyAttnGpu.Sm90StalePlanNeverFaults:VerifyAttnGpu.Sm90PlanForOtherParamsPoisonsEveryRow:VerifyAttnGpu.NanScoresMakeTheirRowsNaN:VerifyAttnGpu.HostVisibleErrorsReturnCodesWithoutLaunching'
  timeout "${MEMCHECK_TIMEOUT:-200}" compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
    "$c/test_verify_attn_gpu" --gtest_brief=1 --gtest_filter="$filter" > "$out/memcheck.log" 2>&1
  echo "== memcheck: exit $? at $(( $(date +%s) - start )) s"
  grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid|out of bounds" "$out/memcheck.log" | head -20
fi
