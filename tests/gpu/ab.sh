#!/usr/bin/env bash
# A same-run A/B of the tree-verify attention kernels on the GPU machine, in one device call: (unless
# SKIP_TESTS=1) every GPU test of tests/gpu/run.sh on the new library, then the full sm90 table (planned and
# unplanned) for the base library (.gpu-carry/base/lib: BASE_LIB=<dir holding libddtree_kernels.so> at pack time)
# and the new one back to back, a second sample of SHAPES (P,T,batch ...) alternating base / new (SECOND_ROUNDS=N: N
# of them, medians in the summary), the portable
# kernel's quick table for both (SKIP_PORTABLE=1 skips it; SKIP_SM90=1 skips the sm90 tables), and the stamped profile of the new library when
# packed with PROFILE=1. Variants (VARIANTS="name=<lib dir> ..." at pack time: .gpu-carry/variants/<name>/lib)
# are timed beside them in the same call, each after the new build's attention GPU tests run against its library
# (SKIP_VARIANT_TESTS=1 skips those; a test that only a variant's branch adds is not among them, and a variant
# must share the new build's headers: the test binary inlines the plan and workspace layouts), so several
# candidate changes share one device call. The tarball is written on exit, also when the run is killed. Prints the tests' summary, every planned shape that
# moved by more than 2%, the second samples and the geomeans of each library against the base
# (tests/gpu/ab_summary.py); NEW_BENCH_ARGS (e.g. --p-bf16: rows only the new library has) go to every sm90 and
# portable bench of the libraries other than the base (the variants too: a variant library that predates a mode times its default
# under that mode's row name; VARIANT_BENCH_ARGS_<name> replaces them for one variant), BASE_BENCH_ARGS to the base's.
# VARIANT_ENV_<name>="VAR=value ..." sets environment variables for one variant's tests and benches (values without
# spaces or quotes; e.g. DDTREE_PDL=0: the same library with PDL off); in both, a '-' in <name> reads as '_'.
# Everything else goes into one tarball, $OUT/ab.tgz (the device tool returns at most
# 8 files). Usage there: DDTREE_COMMIT=<sha> tests/gpu/ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
c=$PWD/.gpu-carry
final=${OUT:-gpu-out}
out=$(mktemp -d)/ab
mkdir -p "$out" "$final"
# (whatever was measured comes back even when the device's time limit ends the run)
trap 'tar czf "$final/ab.tgz" -C "$(dirname "$out")" ab' EXIT
trap 'exit 143' TERM INT
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start )) s"; }
if [ ! -f "$c/base/lib/libddtree_kernels.so" ]; then
  echo "no base library: pack with BASE_LIB=<dir> tests/gpu/pack.sh"
  exit 2
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  SKIP_BENCH=1 GTEST_ARGS=--gtest_brief=1 ATTN_GTEST_ARGS=--gtest_brief=1 TAIL=3 OUT=$out tests/gpu/run.sh 2>&1 |
    grep -v '^  \(oracle\|portable\|sm90\)' | grep -v '^|' | tail -22
  grep -E "passed|failed" "$out/python_ref.log" | tail -2
  echo "== tests took $(elapsed)"
fi
# A library's bench arguments: BASE_BENCH_ARGS for the base, NEW_BENCH_ARGS for the new one, and for a variant
# VARIANT_BENCH_ARGS_<name> when set (e.g. the same library under another --workspace-scale), else NEW_BENCH_ARGS.
bench_args() {
  case $1 in
    base) echo "${BASE_BENCH_ARGS:-}" ;;
    new) echo "${NEW_BENCH_ARGS:-}" ;;
    *) local v="VARIANT_BENCH_ARGS_${1//-/_}"; echo "${!v-${NEW_BENCH_ARGS:-}}" ;;
  esac
}
# A variant's environment: VARIANT_ENV_<name> (word-split into VAR=value assignments for env); none for base and new.
bench_env() {
  case $1 in
    base | new) ;;
    *) local v="VARIANT_ENV_${1//-/_}"; echo "${!v-}" ;;
  esac
}
. "$PWD/tests/gpu/carry_lib.sh"  # libdir <base | new | variant>
libs="base new"
for v in "$c"/variants/*/lib/libddtree_kernels.so; do
  [ -f "$v" ] || continue
  name=$(basename "$(dirname "$(dirname "$v")")")
  libs="$libs $name"
  if [ "${SKIP_VARIANT_TESTS:-0}" != 1 ]; then
    env $(bench_env "$name") LD_LIBRARY_PATH=$(libdir "$name") timeout 300 "$c/test_verify_attn_gpu" --gtest_brief=1 \
      > "$out/verify_attn_gpu_$name.log" 2>&1
    echo "variant $name: attention GPU tests exit $? ($(grep -E '^\[  (PASSED|FAILED)' "$out/verify_attn_gpu_$name.log" | tr '\n' ' ')) at $(elapsed)"
  fi
done
# (SKIP_SM90=1: a change to the portable kernel alone; its quick table below is then the measurement)
if [ "${SKIP_SM90:-0}" != 1 ]; then
  for lib in $libs; do
    extra=$(bench_args $lib)
    env $(bench_env $lib) LD_LIBRARY_PATH=$(libdir $lib) timeout 180 "$c/bench_verify_attn" --sm90-only --plan $extra > "$out/sm90_$lib.txt" 2>&1
    echo "sm90 table, $lib: exit $? at $(elapsed)"
  done
  # (SECOND_ROUNDS=N: N rounds over SHAPES, the libraries alternating in each; the summary prints each shape's median
  # and its samples: for changes of 1-2 us on the batch-1 shapes, whose single samples vary by about that much)
  for round in $(seq "${SECOND_ROUNDS:-1}"); do
    for shape in ${SHAPES:-512,16,64 512,1,64 2048,1,64 2048,8,64 2048,16,64 8192,1,32 32768,1,32 32768,8,32 131072,1,1 32768,1,1}; do
      for lib in $libs; do
        extra=$(bench_args $lib)
        env $(bench_env $lib) LD_LIBRARY_PATH=$(libdir $lib) "$c/bench_verify_attn" --sm90-only --plan $extra --shape "$shape" 2>&1 |
          grep -E '^\| [0-9]+ \|' | sed "s/^/$lib /"
      done
    done
  done > "$out/second.txt"
  echo "second samples at $(elapsed)"
fi
if [ "${SKIP_PORTABLE:-0}" != 1 ]; then
  for lib in $libs; do
    extra=$(bench_args $lib)
    env $(bench_env $lib) LD_LIBRARY_PATH=$(libdir $lib) timeout 90 "$c/bench_verify_attn" --quick --portable-only $extra > "$out/portable_$lib.txt" 2>&1
    echo "portable table, $lib: exit $? at $(elapsed)"
  done
fi
[ -x "$c/attn_profile_sm90" ] && LD_LIBRARY_PATH=$c/lib timeout 90 "$c/attn_profile_sm90" > "$out/profile_new.txt" 2>&1
python3 tests/gpu/ab_summary.py "$out"
echo "== done at $(elapsed)"
