#!/usr/bin/env bash
# Runs ddtree-engine end to end on the cpu backend:
#   1. generates the small test checkpoint (tools/gen_checkpoint.py --preset moe) if it is absent,
#   2. starts `mpirun -np 2 ddtree-rank` (rank 0 serves ddtree.v1.DDTree on 127.0.0.1; both ranks hold a
#      tensor-parallel shard),
#   3. waits until it serves (ddtree-cli health),
#   4. streams one generation through ddtree-cli (tree mode, n-gram drafter),
#   5. drains the job (SIGUSR1, which mpirun forwards) and waits for every rank to exit 0.
# Builds first if needed. Environment: BUILD_DIR (build), NP (2), MODEL_DIR ($BUILD_DIR/checkpoints/moe),
# PORT (0 = any free port), DDTREE_PYTHON (a Python with numpy). Extra arguments go to `ddtree-cli generate`
# (e.g. --mode autoregressive, --max-new-tokens 100, --temperature 0.8 --seed 3).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build}
np=${NP:-2}
if [ ! -x "$build/bin/ddtree-rank" ] || [ ! -x "$build/bin/ddtree-cli" ]; then
  deploy/install-deps.sh >/dev/null
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j "$(nproc)" --target ddtree-rank ddtree-cli
fi

model=${MODEL_DIR:-$build/checkpoints/moe}
if [ ! -f "$model/config.json" ]; then
  py=${DDTREE_PYTHON:-}
  if [ -z "$py" ]; then
    if python3 -c "import numpy" 2>/dev/null; then py=python3; else py="$(deploy/install-deps.sh | tail -n 1)/bin/python"; fi
  fi
  "$py" tools/gen_checkpoint.py "$model" --preset moe
fi

mpi_flags=(--oversubscribe --mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
tmp=$(mktemp -d)
echo "== mpirun -np $np ddtree-rank --model $model (cpu backend; log: $tmp/server.log)"
mpirun -np "$np" "${mpi_flags[@]}" "$build/bin/ddtree-rank" --model "$model" --listen "127.0.0.1:${PORT:-0}" \
  --port-file "$tmp/port" --mode tree --drafter ngram --depth 4 --budget 8 >"$tmp/server.log" 2>&1 &
job=$!
cleanup() { kill -TERM "$job" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 600); do
  [ -f "$tmp/port" ] && break
  if ! kill -0 "$job" 2>/dev/null; then cat "$tmp/server.log" >&2; echo "run.sh: the job exited before serving" >&2; exit 1; fi
  sleep 0.1
done
[ -f "$tmp/port" ] || { cat "$tmp/server.log" >&2; echo "run.sh: not serving after 60 s" >&2; exit 1; }
addr="127.0.0.1:$(cat "$tmp/port")"
"$build/bin/ddtree-cli" health --addr "$addr" --wait-s 30
echo "== ddtree-cli generate --addr $addr (tree mode, n-gram drafter)"
# A prompt that repeats itself, so the n-gram drafter finds matches and builds real trees.
"$build/bin/ddtree-cli" generate --addr "$addr" --prompt 17,42,99,7,17,42,99,7,17,42,99 --max-new-tokens 32 \
  --mode tree --drafter ngram "$@"
echo "== draining (SIGUSR1)"
kill -USR1 "$job"
rc=0
wait "$job" || rc=$?
trap - EXIT
sed 's/^/   server| /' "$tmp/server.log"
rm -rf "$tmp"
echo "== job exit $rc"
exit "$rc"
