#!/usr/bin/env bash
# Create the peer venv for the official SAC Flow code (Elessar123/SAC-FLOW, from_scratch_code/) and check it out
# if missing.
#   bash experiments/peers/sac_flow_official/setup.sh [VENV] [CHECKOUT]
# VENV defaults to /work/peers/sac-flow-venv, CHECKOUT to /work/peers/SAC-FLOW (see README.md for the commit).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-/work/peers/sac-flow-venv}"
checkout="${2:-/work/peers/SAC-FLOW}"
commit=3df8b9dc33de5160851a82322bc6c9005886f3ce
if [ ! -x "$venv/bin/python" ]; then
    python3.11 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet -r "$here/requirements.txt"
"$venv/bin/python" -c "import jax, flax, optax, tyro, torch, gymnasium, mujoco; gymnasium.make('Hopper-v5').close(); \
print('peer venv ok: jax', jax.__version__, 'flax', flax.__version__, 'gymnasium', gymnasium.__version__, jax.devices())"
if [ ! -d "$checkout/.git" ] && [ ! -f "$checkout/.git" ]; then
    mirror=/work/.mirror/Elessar123+SAC-FLOW/repo
    if [ -d "$mirror" ]; then
        git clone --quiet "$mirror" "$checkout"
        git -C "$checkout" checkout --quiet "$commit"
    else
        echo "official code not found at $checkout: clone github.com/Elessar123/SAC-FLOW there and check out $commit" >&2
        echo "  git clone https://github.com/Elessar123/SAC-FLOW $checkout && git -C $checkout checkout $commit" >&2
        exit 0
    fi
fi
have="$(git -C "$checkout" rev-parse HEAD)"
if [ "$have" != "$commit" ]; then
    echo "note: $checkout is at $have, the shim was written against $commit" >&2
fi
