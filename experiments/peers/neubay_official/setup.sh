#!/usr/bin/env bash
# Create the peer venv for the official NeuBay code (twni2016/neubay, JAX/Equinox, CPU) and check the checkout.
#   bash experiments/peers/neubay_official/setup.sh [VENV] [CHECKOUT]
# VENV defaults to /work/peers/neubay-venv, CHECKOUT to /work/peers/neubay (see README.md for the commit).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-/work/peers/neubay-venv}"
checkout="${2:-/work/peers/neubay}"
commit=5604bad
if [ ! -x "$venv/bin/python" ]; then
    python3.11 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet -r "$here/requirements.txt"
"$venv/bin/python" -c "import jax, equinox, optax, distrax, hydra, gym, gymnasium, mujoco, h5py, sklearn; print('peer venv ok: jax', jax.__version__, jax.default_backend())"
if [ ! -d "$checkout/.git" ] && [ ! -f "$checkout/.git" ]; then
    echo "official code not found at $checkout: clone github.com/twni2016/neubay there and check out $commit" >&2
    echo "  git clone https://github.com/twni2016/neubay $checkout && git -C $checkout checkout $commit" >&2
    exit 0
fi
have="$(git -C "$checkout" rev-parse HEAD)"
case "$have" in
    "$commit"*) ;;
    *) echo "note: $checkout is at $have, the shim was written against $commit" >&2 ;;
esac
