#!/usr/bin/env bash
# Dev (not a test): where the sm_90a main kernel's warps stall, per SASS instruction (Nsight Compute's warp-state
# sampling, the SourceCounters section), for the libraries of an ab.sh carry: the base (.gpu-carry/base/lib), the new
# one (.gpu-carry/lib) and any variants. Expects .gpu-carry from `BASE_LIB=... tests/gpu/pack.sh`. Usage there:
#   [SOURCE_SHAPE=P,T,batch] [SOURCE_ARGS="--p-bf16"] [SOURCE_KERNEL=<mangled-name regex>] [SOURCE_LIBS="base new ..."] \
#     [KEEP_REPORT=1] bench/dev/ncu_source.sh
# SOURCE_KERNEL picks the instantiation (template <bool kPlanned, bool kPBf16>): the default, ILb0ELb1E, is the
# unplanned bf16-P one (the planned one runs the same tile loop). Writes under $OUT (default ./gpu-out), per library:
# src_<lib>.csv.gz (one row per SASS instruction: its samples by stall reason), details_<lib>.txt (the sections'
# tables) and prints the instructions with the most samples (bench/dev/ncu_source_top.py) and the samples by phase
# (bench/dev/ncu_phases.py; SOURCE_SPLIT_KEYS: the split_keys SOURCE_ARGS sets, default 512); the .ncu-rep.gz only with
# KEEP_REPORT=1 (the device tool returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
c=$PWD/.gpu-carry
shape=${SOURCE_SHAPE:-32768,16,32}
args=${SOURCE_ARGS:---p-bf16}
kernel=${SOURCE_KERNEL:-verify_attn_sm90_kernelILb0ELb1E}
start=$(date +%s)
libs="new"
[ -f "$c/base/lib/libddtree_kernels.so" ] && libs="base new"
for v in "$c"/variants/*/lib/libddtree_kernels.so; do
  [ -f "$v" ] && libs="$libs $(basename "$(dirname "$(dirname "$v")")")"
done
for lib in ${SOURCE_LIBS:-$libs}; do
  case $lib in base) dir=$c/base/lib ;; new) dir=$c/lib ;; *) dir=$c/variants/$lib/lib ;; esac
  rep=$out/ncu_$lib
  LD_LIBRARY_PATH=$dir timeout "${NCU_TIMEOUT:-200}" ncu --clock-control none --kernel-name-base mangled \
    --kernel-name "regex:$kernel" --launch-count 1 --section SourceCounters --section WarpStateStats \
    --import-source no -f -o "$rep" "$c/bench_verify_attn" --sm90-only $args --shape "$shape" > "$out/run_$lib.log" 2>&1
  echo "== $lib: ncu exit $? at $(( $(date +%s) - start )) s"
  ncu -i "$rep.ncu-rep" --page details --print-details all > "$out/details_$lib.txt" 2>&1
  grep -E "^ +(Duration|Warp Cycles Per Issued Instruction|Stall [A-Za-z ]+|Issued Warp|No Eligible)" "$out/details_$lib.txt" | head -30
  if ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$out/src_$lib.csv" 2> "$out/src_$lib.err"; then
    python3 bench/dev/ncu_source_top.py "$out/src_$lib.csv" 40
    python3 bench/dev/ncu_phases.py "$out/src_$lib.csv" "$shape" ${SOURCE_SPLIT_KEYS:-512}
  else
    echo "   (the source page did not export: $(head -c 300 "$out/src_$lib.err"))"
  fi
  gzip -f "$out/src_$lib.csv"
  rm -f "$rep.ncu-rep.gz" "$out/src_$lib.err"
  if [ "${KEEP_REPORT:-0}" = 1 ]; then gzip -f "$rep.ncu-rep"; else rm -f "$rep.ncu-rep"; fi
done
echo "== done at $(( $(date +%s) - start )) s"
