#!/usr/bin/env bash
# deploy/launch.sh turns SIGTERM into a graceful drain: start a 2-rank job on the fixture checkpoint, wait
# until it serves, stream one request, SIGTERM the launcher, and require exit 0 within 30 s (a hard kill
# would end non-zero). usage: launch_drain.sh BUILD_DIR MODEL_DIR
set -uo pipefail
build=$1 model=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
DDTREE_RANK="$build/bin/ddtree-rank" "$root/deploy/launch.sh" -np 2 --oversubscribe --mca pml ob1 \
  --mca btl self,vader --mca btl_vader_single_copy_mechanism none -- --model "$model" --listen 127.0.0.1:0 \
  --port-file "$tmp/port" >"$tmp/log" 2>&1 &
launcher=$!
for _ in $(seq 600); do [ -f "$tmp/port" ] && break; sleep 0.1; done
[ -f "$tmp/port" ] || { cat "$tmp/log"; echo "FAIL: not serving"; kill -KILL $launcher; exit 1; }
addr="127.0.0.1:$(cat "$tmp/port")"
"$build/bin/ddtree-cli" generate --addr "$addr" --prompt 5,6,7,8 --max-new-tokens 4 >/dev/null || { cat "$tmp/log"; echo "FAIL: generate"; exit 1; }
kill -TERM $launcher
rc=124
for _ in $(seq 300); do
  if ! kill -0 $launcher 2>/dev/null; then wait $launcher; rc=$?; break; fi
  sleep 0.1
done
cat "$tmp/log"
rm -rf "$tmp"
if [ "$rc" -ne 0 ]; then echo "FAIL: launcher exit $rc after SIGTERM (want 0: drained)"; exit 1; fi
echo "PASS: SIGTERM drained the job, exit 0"
