#!/usr/bin/env bash
# Runs ddtree-engine's current main job on the built-in default: one DDTree speculative step of the
# kernels (top-K -> tree build -> accept) on the cuda backend when a GPU is present, else the cpu backend.
# Builds first if needed. Extra arguments go to ddtree-demo (--help lists them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build}
if [ ! -x "$build/bin/ddtree-demo" ]; then
  deploy/install-deps.sh >/dev/null
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j "$(nproc)" --target ddtree-demo
fi
exec "$build/bin/ddtree-demo" --backend auto "$@"
