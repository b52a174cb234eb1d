#!/usr/bin/env bash
# Installs what the build and tests need, builds from scratch in build-test/ (or $BUILD_DIR) and runs every
# test. GPU tests report "Skipped" where no GPU is visible. Usage: deploy/test.sh [extra ctest args]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=$(deploy/install-deps.sh | tail -n 1)
build=${BUILD_DIR:-build-test}
jobs=${JOBS:-$(nproc)}
echo "== configure ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDTREE_PYTHON="$venv/bin/python" >/dev/null
echo "== build (-j$jobs)"
cmake --build "$build" -j "$jobs"
echo "== test"
cd "$build"
ctest --output-on-failure -j "$jobs" "$@"
