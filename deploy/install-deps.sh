#!/usr/bin/env bash
# Installs everything ddtree-engine needs to build and test on Debian 12 (dev and CI machines).
# Idempotent: apt packages are installed only when missing; the Python virtual environment lives outside
# the clone at $DDTREE_VENV_ROOT/<hash of deploy/requirements-*.txt>, reused while the hash matches.
# Prints the venv path on its last line (callers: VENV=$(deploy/install-deps.sh | tail -n1)).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
apt_pkgs=(cmake ninja-build g++ python3-venv
  libopenmpi-dev openmpi-bin
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libgtest-dev nlohmann-json3-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

req="$here/requirements-test.txt"
req_torch="$here/requirements-torch.txt"
hash=$(cat "$req" "$req_torch" | sha256sum | cut -c1-16)
root=${DDTREE_VENV_ROOT:-/opt/ddtree-venv}
venv="$root/$hash"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  echo "install-deps: creating Python venv $venv" >&2
  rm -rf "$venv"; mkdir -p "$root"
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -r "$req" >&2
  # torch without its multi-GB CUDA dependency tree (see requirements-torch.txt), else the full install.
  t0=$(date +%s)
  torch_pkgs=$(grep -v '^#' "$req_torch" | grep -v '^\s*$')
  torch_deps=$(sed -n 's/^#deps: //p' "$req_torch")
  # Its pure-Python dependencies first, then the wheels with --no-deps (which also skips pip's warning
  # about the CUDA wheels left out on purpose).
  "$venv/bin/python" -m pip install -q $torch_deps >&2
  "$venv/bin/python" -m pip install -q --no-deps $torch_pkgs >&2
  if ! "$venv/bin/python" -c "import torch; torch.ones(2) @ torch.ones(2)" >/dev/null 2>&1 || [ -n "${DDTREE_TORCH_FULL:-}" ]; then
    torch_req=$(grep '^torch==' "$req_torch")
    echo "install-deps: torch without its CUDA wheels does not import here; installing $torch_req with all dependencies" >&2
    "$venv/bin/python" -m pip install -q "$torch_req" >&2
  fi
  "$venv/bin/python" -c "import torch, transformers" >&2
  echo "install-deps: torch ready in $(( $(date +%s) - t0 )) s" >&2
  touch "$venv/.complete"
else
  echo "install-deps: reusing Python venv $venv" >&2
fi
echo "$venv"
