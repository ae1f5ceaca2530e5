#!/usr/bin/env bash
# Create the peer venv for the official RAVL code (anyasims/edge-of-reach) and check it out if missing.
#   bash experiments/peers/ravl_official/setup.sh [VENV] [CHECKOUT]
# VENV defaults to /work/peers/ravl-venv, CHECKOUT to /work/peers/edge-of-reach (see README.md for the commit).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-/work/peers/ravl-venv}"
checkout="${2:-/work/peers/edge-of-reach}"
commit=18b50853219676d120c6238f399664500eaa1f0c
if [ ! -x "$venv/bin/python" ]; then
    python3.11 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet -r "$here/requirements.txt"
"$venv/bin/python" -c "import torch, gymnasium, mujoco, h5py, pyrallis, tqdm; print('peer venv ok:', torch.__version__)"
if [ ! -d "$checkout/.git" ] && [ ! -f "$checkout/.git" ]; then
    echo "official code not found at $checkout: clone github.com/anyasims/edge-of-reach there and check out $commit" >&2
    echo "  git clone https://github.com/anyasims/edge-of-reach $checkout && git -C $checkout checkout $commit" >&2
    exit 0
fi
have="$(git -C "$checkout" rev-parse HEAD)"
if [ "$have" != "$commit" ]; then
    echo "note: $checkout is at $have, the shim was written against $commit" >&2
fi
