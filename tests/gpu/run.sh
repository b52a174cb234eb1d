#!/usr/bin/env bash
# Everything that needs the GPU, in one device call: kernel tests vs the CPU twins, the Python references
# with PyTorch CUDA tensors, the demo on cuda, and the kernel benchmark (SKIP_KERNEL_BENCH=1 skips it alone). Expects the binaries built on the
# dev machine in .gpu-carry/ (tests/gpu/pack.sh makes it); writes logs under $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
c=.gpu-carry
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export DDTREE_KERNELS_LIB=$PWD/$c/lib/libddtree_kernels.so
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"
echo "commit ${DDTREE_COMMIT:-unknown (pass DDTREE_COMMIT)}" | tee -a "$out/gpu.txt"
declare -A rc
step() {  # step NAME COMMAND...: runs, logs to $out/NAME.log, records the exit code
  local name=$1; shift
  echo "== $name"
  "$@" > "$out/$name.log" 2>&1
  rc[$name]=$?
  tail -n ${TAIL:-25} "$out/$name.log"
}
step gpu_tests "$c/test_kernels_gpu" ${GTEST_ARGS:-}
[ -x "$c/test_fast_math_gpu" ] && step fast_math_gpu "$c/test_fast_math_gpu" ${GTEST_ARGS:-}
[ "${SKIP_PY:-0}" = 1 ] || step python_ref python3 -m pytest -q -rs -p no:cacheprovider tests/python
[ "${SKIP_DEMO:-0}" = 1 ] || step demo "$c/ddtree-demo" --backend cuda --batch 2 --budget 32 --depth 6
if [ "${SKIP_BENCH:-0}" != 1 ] && [ "${SKIP_KERNEL_BENCH:-0}" != 1 ]; then TAIL=60 step bench "$c/bench_kernels" ${BENCH_ARGS:-}; fi
# The tree builder's and the attention kernel's per-stage profiles (dev harnesses; packed only with PROFILE=1).
[ -x "$c/tree_profile" ] && [ "${SKIP_TREE_PROFILE:-0}" != 1 ] && TAIL=40 step tree_profile "$c/tree_profile"
[ -x "$c/attn_profile" ] && TAIL=20 step attn_profile "$c/attn_profile"
[ -x "$c/attn_profile_sm90" ] && TAIL=20 step attn_profile_sm90 "$c/attn_profile_sm90"
[ -x "$c/smid_probe" ] && TAIL=8 step smid_probe "$c/smid_probe"
[ -x "$c/wgmma_rate" ] && TAIL=18 step wgmma_rate "$c/wgmma_rate"
# Tree-verify attention (issue 5): oracle vs CPU twin / brute force; the oracle's benchmark (SKIP_ATTN=1 skips
# both, SKIP_BENCH=1 the benchmark; ATTN_BENCH_ARGS=--quick for the short table).
if [ "${SKIP_ATTN:-0}" != 1 ]; then
  step verify_attn_gpu "$c/test_verify_attn_gpu" --gtest_output="xml:$out/verify_attn_gpu.xml" ${ATTN_GTEST_ARGS:-}
  # Where the tests' ~2 minutes go (the largest share of every device call): the slowest tests, from gtest's XML
  # (it has every test's time also under --gtest_brief).
  python3 - "$out/verify_attn_gpu.xml" <<'PY' 2>/dev/null | tee "$out/verify_attn_gpu_slowest.txt"
import sys, xml.etree.ElementTree as ET
cases = [(float(t.get("time", 0)), t.get("classname", "") + "." + t.get("name", "")) for t in ET.parse(sys.argv[1]).iter("testcase")]
total = sum(t for t, _ in cases)
print(f"verify_attn_gpu: {len(cases)} tests, {total:.1f} s; slowest:", ", ".join(f"{n} {t:.1f} s" for t, n in sorted(cases, reverse=True)[:8]))
PY
  if [ "${SKIP_BENCH:-0}" != 1 ]; then
    TAIL=80 step bench_verify_attn "$c/bench_verify_attn" ${ATTN_BENCH_ARGS:-}
    # Variants (ATTN_BENCH_EXTRA: argument lists separated by ';', e.g. "--quick --portable-only --page 1").
    i=0
    IFS=';' read -ra extra <<< "${ATTN_BENCH_EXTRA:-}"
    for args in "${extra[@]}"; do
      i=$((i + 1))
      TAIL=30 step "bench_verify_attn_v$i" "$c/bench_verify_attn" $args
    done
    # The portable kernel against a PyTorch implementation in the same process (TORCH_BENCH_ARGS=--full;
    # SKIP_TORCH_BENCH=1 skips it).
    [ "${SKIP_TORCH_BENCH:-0}" = 1 ] || TAIL=30 step bench_verify_attn_torch python3 bench/bench_verify_attn_torch.py ${TORCH_BENCH_ARGS:-}
  fi
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | sed 's/^/after: /' | tee -a "$out/gpu.txt"
echo "== summary"
fail=0
for k in "${!rc[@]}"; do echo "$k: exit ${rc[$k]}"; [ "${rc[$k]}" = 0 ] || fail=1; done
exit $fail
