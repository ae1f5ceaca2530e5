#!/usr/bin/env bash
# NeuBay seeds of this study on a machine with a GPU, where its update makes ~21 gradient steps/s against 0.5-1 on
# this project's 2-core CPU (experiments/model_based_speed): the dataset is regenerated there (the 1M-row file is
# larger than a device call carries; the same command and seed), its arrays' digests are written beside the runs so
# that they can be compared with the local file's, and the seeds train side by side from the shared dynamics fit.
#
#   here:   mkdir -p .devdata/hopper-random-dynamics && cp RUNS/hopper-random-v5/dynamics/{model.pt,config.json} \
#               .devdata/hopper-random-dynamics/            # plus .whl: experiments/seed_batching/README.md
#   there:  SENT_COMMIT=<here's HEAD> bash experiments/neubay_hopper_random/device_seeds.sh \
#               .devdata/hopper-random-dynamics $OUT 1 2
#   here:   python experiments/neubay_hopper_random/data_digest.py hopper-random-v5 | diff - <(jq . OUT/data_digest.json)
#
# Only metrics.jsonl, config.json and the log of each seed come back (a device call returns at most 8 files: two
# seeds a call, with the digest and sent_commit.txt); they are copied to OUT every 30 s, so a call cut off at its
# time limit still returns the curve so far.
# STEPS (default 10000), DEVICE (default cuda) and EVAL_EVERY (default 2000) override the run's budget.
# SENT_COMMIT (the commit of the tree sent, written into the command here: `SENT_COMMIT=$(git rev-parse --short
# HEAD)`) goes to OUT/sent_commit.txt: a device's copy of .git can be older than the working tree it receives (seen
# 2026-11-27: the runs recorded the session's first commit, "+dirty"), so the runs' own record is not enough.
set -euo pipefail
model=$1 out=$2
shift 2
steps=${STEPS:-10000} device=${DEVICE:-cuda} every=${EVAL_EVERY:-2000}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
runs=$(mktemp -d /tmp/neubay_seeds.XXXX)
mkdir -p "$out"
[ -n "${SENT_COMMIT:-}" ] && echo "$SENT_COMMIT" > "$out/sent_commit.txt"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg
python3 -m ctrl_rl data generate --env Hopper-v5 --level random --no-progress
python3 "$here/data_digest.py" hopper-random-v5 > "$out/data_digest.json"
copy() {
  for s in "$@"; do
    for f in metrics.jsonl config.json; do
      [ -f "$runs/neubay-s$s/$f" ] && cp "$runs/neubay-s$s/$f" "$out/s$s-$f"
    done
  done
  return 0
}
pids=()
for s in "$@"; do
  python3 -m ctrl_rl train neubay --preset "$root/experiments/presets/neubay-hopper-random.json" \
    --dataset hopper-random-v5 --model "$model" --env Hopper-v5 --total-steps "$steps" --eval-every "$every" \
    --eval-episodes 10 --seed "$s" --run-dir "$runs/neubay-s$s" --checkpoint-every 1000000000 --no-progress \
    --device "$device" > "$out/s$s.log" 2>&1 &
  pids+=($!)
done
alive() { for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
while alive; do sleep 30; copy "$@"; done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
copy "$@"
exit $status
