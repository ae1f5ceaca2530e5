"""Issue 30 part 3: less update work per env step for PPO on HalfCheetah-v5, and what it costs in time to return 3000.

The `halfcheetah` preset (envpool, 128 envs, T=32, 5 epochs x 2 minibatches of 2,048) runs at 0.4-0.5 of raw
envpool stepping on two cores; its update is arithmetic-bound (experiments/ppo_halfcheetah_sps/README.md), so the
lever left is less update work per env step: fewer epochs, or one minibatch of 4,096 per epoch. The target allows it
only with no loss in the time to return 3000. This script measures, in one invocation, for each variant and seed:

  - env-steps/s of the whole training run (``step / wall_time`` of the last metrics row; start-up excluded), and its
    ratio to raw envpool stepping (128 envs, random actions) measured before each seed's runs;
  - the training wall time until the mean return of the episodes that ended in a logging interval first reaches
    3000 (the measure of experiments/time_to_3000), and the final return at ``--steps`` env steps.

Variants are ``E<epochs>M<minibatch>`` (``E5M2048`` is the preset). For every seed the variants run in turn, the
order rotated from seed to seed so that a drift of the machine's speed hits every variant alike. Results go to
``ppo_epochs.json`` after every run (resumable: a (variant, seed) already in it with the same settings is skipped;
``--fresh`` starts over), with the markdown table and a PNG.

    python experiments/ppo_epochs/ppo_epochs.py                      # 5 variants x 3 seeds x 1M steps: ~15 min
    python experiments/ppo_epochs/ppo_epochs.py --variants E5M2048 E3M2048 --seeds 0 --steps 200000 --name smoke
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # experiments/: common.py, ppo_halfcheetah_sps/
from common import git_commit, run_preset  # noqa: E402

TARGET = 3000.0
VARIANTS = ("E5M2048", "E4M2048", "E3M2048", "E2M2048", "E5M4096")
NUM_ENVS = 128  # the preset's


def parse_variant(name: str) -> tuple[int, int]:
    m = re.fullmatch(r"E(\d+)M(\d+)", name)
    if not m:
        raise SystemExit(f"variant {name!r} is not of the form E<epochs>M<minibatch>, e.g. E3M2048")
    return int(m.group(1)), int(m.group(2))


def run(variant: str, seed: int, steps: int) -> dict:
    epochs, minibatch = parse_variant(variant)
    rows, process_s = run_preset("halfcheetah", seed, steps,
                                 extra=("--epochs", str(epochs), "--minibatch-size", str(minibatch)))
    last = rows[-1]
    ep = [r for r in rows if r.get("episode_return") is not None]
    hit = next((r for r in ep if r["episode_return"] >= TARGET), None)
    return {"variant": variant, "seed": seed, "steps": last["step"], "train_s": last["wall_time"],
            "process_s": process_s, "steps_per_s": last["step"] / last["wall_time"],
            "time_to_3000_s": hit["wall_time"] if hit else None, "step_at_3000": hit["step"] if hit else None,
            "final_return": ep[-1]["episode_return"] if ep else None,
            "curve": [[r["step"], r["wall_time"], r["episode_return"]] for r in ep]}


def raw_envpool(steps: int) -> float:
    from ppo_halfcheetah_sps.ppo_halfcheetah_sps import raw_envpool as raw

    return raw(NUM_ENVS, steps)


def _median(xs: list) -> float | None:
    return statistics.median(xs) if xs else None


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def summarize(p: dict) -> dict:
    """Per variant: medians over seeds of steps/s, of steps/s over the same seed's raw envpool, of the time to 3000
    (a run that never reached it counts as its training time, and a median at or above such a value is flagged
    censored), and of the final return; and each against the preset's (E5M2048) median."""
    out = {}
    for v in p["settings"]["variants"]:
        rs = [r for r in p["runs"] if r["variant"] == v]
        if not rs:
            continue
        raw = {r["seed"]: r["steps_per_s"] for r in p["raw"]}
        ratios = [r["steps_per_s"] / raw[r["seed"]] for r in rs if r["seed"] in raw]
        t = [r["time_to_3000_s"] if r["time_to_3000_s"] is not None else r["train_s"] for r in rs]
        t_med = statistics.median(t)
        out[v] = {"seeds": [r["seed"] for r in rs], "steps_per_s": statistics.median(r["steps_per_s"] for r in rs),
                  "of_raw": statistics.median(ratios) if ratios else None,
                  "time_to_3000_s": t_med,
                  "time_to_3000_censored": any(r["time_to_3000_s"] is None and x <= t_med for r, x in zip(rs, t)),
                  "reached_3000": sum(r["time_to_3000_s"] is not None for r in rs),
                  "final_return": _median([r["final_return"] for r in rs if r["final_return"] is not None])}
    base = out.get("E5M2048")
    if base:
        for v in out.values():
            v["time_vs_preset"] = v["time_to_3000_s"] / base["time_to_3000_s"]
            v["speed_vs_preset"] = v["steps_per_s"] / base["steps_per_s"]
    return out


def markdown(p: dict) -> str:
    s, summ = p["settings"], p["summary"]
    lines = [f"# PPO HalfCheetah-v5: update work per env step against time to return 3000 ({p['date']})", "",
             f"Preset `halfcheetah` with `--epochs E --minibatch-size M`; {s['steps']:,} env steps per run, seeds "
             f"{s['seeds']}; raw envpool ({NUM_ENVS} envs, random actions) before each seed's runs; commit "
             f"{p['commit']}; load average (1 min) at the runs {p['load']}.", "",
             "| variant | gradient steps / update | env-steps/s | of raw envpool | x preset speed "
             "| time to 3000 (s) | x preset time | reached | final return |",
             "|---|---|---|---|---|---|---|---|---|"]
    for v, r in summ.items():
        e, m = parse_variant(v)
        grad = e * -(-(NUM_ENVS * 32) // m)
        cens = " (censored)" if r["time_to_3000_censored"] else ""
        lines.append(f"| {v} | {grad} | {r['steps_per_s']:,.0f} | {r['of_raw']:.2f} | "
                     f"{r.get('speed_vs_preset', float('nan')):.2f} | {r['time_to_3000_s']:.1f}{cens} | "
                     f"{r.get('time_vs_preset', float('nan')):.2f} | {r['reached_3000']}/{len(r['seeds'])} | "
                     f"{_num(r['final_return'])} |")
    lines += ["", "Per run:", "", "| variant | seed | env-steps/s | time to 3000 (s) | step at 3000 | final return |",
              "|---|---|---|---|---|---|"]
    for r in p["runs"]:
        t = "not reached" if r["time_to_3000_s"] is None else f"{r['time_to_3000_s']:.1f}"
        lines.append(f"| {r['variant']} | {r['seed']} | {r['steps_per_s']:,.0f} | {t} | {r['step_at_3000'] or '-'} | "
                     f"{_num(r['final_return'])} |")
    lines += ["", "Raw envpool env-steps/s per seed: " + ", ".join(f"{r['seed']}: {r['steps_per_s']:,.0f}"
                                                                for r in p["raw"]),
              "", f"`{p['command']}`", ""]
    return "\n".join(lines)


def plot(p: dict, dest: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    cmap = plt.get_cmap("tab10")
    colors = {v: cmap(i) for i, v in enumerate(p["settings"]["variants"])}
    for r in p["runs"]:
        c = r["curve"]
        a.plot([x[1] for x in c], [x[2] for x in c], color=colors[r["variant"]], lw=1,
               label=r["variant"] if r["seed"] == p["settings"]["seeds"][0] else None)
    a.axhline(TARGET, color="k", ls=":", lw=1)
    a.set(xlabel="training wall time (s)", ylabel="mean training return", title="learning against wall time")
    a.legend(fontsize=8)
    summ = p["summary"]
    for v, r in summ.items():
        b.scatter(r["of_raw"], r["time_to_3000_s"], color=colors[v], label=v)
        for x in p["runs"]:
            if x["variant"] == v and x["time_to_3000_s"] is not None:
                raw = next(y["steps_per_s"] for y in p["raw"] if y["seed"] == x["seed"])
                b.scatter(x["steps_per_s"] / raw, x["time_to_3000_s"], color=colors[v], s=8, alpha=0.5)
    b.axvline(0.65, color="k", ls=":", lw=1)
    b.set(xlabel="env-steps/s of raw envpool (median; dots: seeds)", ylabel="time to return 3000 (s)",
          title="speed against time to 3000")
    fig.tight_layout()
    fig.savefig(dest, dpi=120)


def main() -> None:
    from ctrl_rl.envs.gymnasium import filter_mujoco_warnings

    filter_mujoco_warnings()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), help="E<epochs>M<minibatch>, e.g. E3M2048")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=1_000_000, help="env steps per run")
    ap.add_argument("--raw-steps", type=int, default=1_000_000, help="env steps of each raw envpool measurement")
    ap.add_argument("--name", default="ppo_epochs", help="stem of the result files")
    ap.add_argument("--fresh", action="store_true", help="ignore earlier results of the same name")
    a = ap.parse_args()
    for v in a.variants:
        parse_variant(v)
    dest = HERE / f"{a.name}.json"
    settings = {"variants": a.variants, "seeds": a.seeds, "steps": a.steps, "raw_steps": a.raw_steps}
    old = json.loads(dest.read_text()) if dest.exists() and not a.fresh else {}
    same = old.get("settings", {}).get("steps") == a.steps
    p = {"what": "PPO HalfCheetah-v5 preset with fewer update epochs / larger minibatches (experiments/ppo_epochs)",
         "command": "python experiments/ppo_epochs/ppo_epochs.py " + " ".join(sys.argv[1:]),
         "settings": settings, "commit": git_commit(), "machine": {"cpus": os.cpu_count()},
         "runs": old.get("runs", []) if same else [], "raw": old.get("raw", []) if same else [], "load": []}
    for i, seed in enumerate(a.seeds):
        order = a.variants[i % len(a.variants):] + a.variants[:i % len(a.variants)]
        todo = [v for v in order if not any(r["variant"] == v and r["seed"] == seed for r in p["runs"])]
        if not todo:
            continue
        p["load"].append(round(os.getloadavg()[0], 2))
        raw = {"seed": seed, "steps_per_s": raw_envpool(a.raw_steps)}
        p["raw"] = [r for r in p["raw"] if r["seed"] != seed] + [raw]
        print(f"seed {seed}: raw envpool {p['raw'][-1]['steps_per_s']:,.0f} env-steps/s", flush=True)
        for v in todo:
            r = run(v, seed, a.steps)
            p["runs"].append(r)
            t = "not reached" if r["time_to_3000_s"] is None else f"{r['time_to_3000_s']:.1f} s"
            print(f"  {v} seed {seed}: {r['steps_per_s']:,.0f} env-steps/s, 3000 at {t}, "
                  f"final {_num(r['final_return'])}", flush=True)
            p["summary"] = summarize(p)
            p["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            dest.write_text(json.dumps(p, indent=1) + "\n")
    p["summary"] = summarize(p)
    p["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    dest.write_text(json.dumps(p, indent=1) + "\n")
    (HERE / f"{a.name}.md").write_text(markdown(p))
    plot(p, HERE / f"{a.name}.png")
    print(markdown(p))


if __name__ == "__main__":
    main()
