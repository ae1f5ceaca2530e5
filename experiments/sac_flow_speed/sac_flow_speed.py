"""Update cost of SAC against SAC Flow (Flow-G, Flow-T, naive) on synthetic Hopper-sized replay data, same run.

Issue 29 section 3 asks for Flow-T's update cost at most 1.5x SAC's and Flow-G's at most 1.3x (same run, same
network sizes). This script measures seconds per ``update(batch)`` (one critic step and one actor + temperature
step: ``policy_delay`` 1) of each variant on batches drawn from an in-memory synthetic replay (no env).

Setting (Hopper-v5 sizes: obs 11, action 3; batch 256): every variant has two 256x256 ReLU critics and SAC's other
defaults (lr 3e-4, tau 0.005, no CrossQ). SAC's actor is 256x256; the flows take the algorithm's defaults (K = 4
steps, target entropy 0, init alpha 0.2, BatchRenorm on the velocity inputs, Flow-T d_model 96 with 2 decoder
layers) with the flow widths set to the SAC actor's 256 (``flow_hidden`` 256, ``noise_hidden`` 256x256: the
``sac_flow-hopper`` preset's widths, which the learning study in experiments/sac_flow used). ``--flow-hidden 512``
measures the algorithm's own default widths (512, noise 512x512) instead.

Each measurement is a subprocess ``--worker`` run with ``PYTHONPATH=<tree>``, so ``--before PATH`` (a git worktree
of the code before a change) and the current tree (``--after``, default this checkout) are timed in the same run;
``--tree NAME=PATH`` adds trees between the two (the effect of each change). A worker builds every variant, counts the
matmul FLOPs of one update of each (torch's FlopCounterMode, forward and backward; elementwise ops not counted),
warms each up (``--warmup`` updates, untimed), then times ``--turns`` blocks of ``--updates`` updates per variant,
variants interleaved in turns; a variant's figure is the median over its blocks. Workers alternate between the trees
(reversed order on odd repeats); the report gives medians over ``--repeats`` workers and the ratios flow/SAC (within
each worker, then their median).

    python experiments/sac_flow_speed/sac_flow_speed.py [--before /tmp/sacflow_before] [--threads 1 2]
    python experiments/sac_flow_speed/sac_flow_speed.py --profile decoded   # torch.profiler top ops of one variant

Writes sac_flow_speed.{json,md} (``--name``) beside this script; ``--profile`` writes profile_<variant>.txt.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # experiments/: common.py
from common import git_head, matmul_flops, synthetic_replay  # noqa: E402

OBS, ACT, BATCH, ROWS = 11, 3, 256, 100_000
VARIANTS = ("sac", "gated", "decoded", "naive", "sac_c", "gated_c", "decoded_c")
LABEL = {"sac": "SAC", "gated": "Flow-G", "decoded": "Flow-T", "naive": "naive flow", "sac_c": "SAC compiled",
         "gated_c": "Flow-G compiled", "decoded_c": "Flow-T compiled"}
# "<variant>_c": the same agent with ``compile=True`` (torch.compile of its critic and actor steps, ``--compile`` on
# the CLI); its compile time falls in the untimed warm-up, and its matmul FLOPs are its eager variant's.


# ----- worker: runs inside the tree under test -----

def make_agent(variant: str, flow_hidden: int, seed: int):
    import torch

    from ctrl_rl.algos.sac import SAC, SACConfig
    from ctrl_rl.algos.sac_flow import FlowVelocity, SACFlow, SACFlowConfig
    from ctrl_rl.envs.protocol import EnvSpec

    spec = EnvSpec("synthetic:hopper", (OBS,), False, ACT, (-1.0,) * ACT, (1.0,) * ACT)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    compiled = variant.endswith("_c")
    variant = variant.removesuffix("_c")
    if variant == "sac":
        return SAC(SACConfig(actor_hidden=(256, 256), critic_hidden=(256, 256), compile=compiled), spec,
                   generator=gen)
    cfg = SACFlowConfig(velocity=cast(FlowVelocity, variant), flow_hidden=flow_hidden,
                        noise_hidden=(flow_hidden, flow_hidden), critic_hidden=(256, 256), compile=compiled)
    return SACFlow(cfg, spec, generator=gen)


def replay(seed: int):
    """A synthetic in-memory replay of Hopper-sized transitions and a sampler of batches from it."""
    return synthetic_replay(OBS, ACT, BATCH, ROWS, seed)


def worker(a: argparse.Namespace) -> None:
    import torch

    import ctrl_rl

    torch.set_num_threads(a.threads)
    sample = replay(a.seed)
    agents = {v: make_agent(v, a.flow_hidden, a.seed) for v in a.variants}
    flops = {}
    for v, agent in agents.items():  # matmul FLOPs of one update (forward and backward), counted by torch
        if v.endswith("_c"):  # a compiled variant computes what its eager twin does: count the twin's
            agent = make_agent(v.removesuffix("_c"), a.flow_hidden, a.seed)
        flops[v] = matmul_flops(lambda agent=agent: agent.update(sample()))
    for agent in agents.values():  # warm-up: allocator, first-call costs, optimizer state
        for _ in range(a.warmup):
            agent.update(sample())
    blocks: dict[str, list[float]] = {v: [] for v in a.variants}
    batches = [sample() for _ in range(a.updates)]  # the same batches for every variant and block
    for turn in range(a.turns):
        order = list(a.variants) if turn % 2 == 0 else list(reversed(a.variants))
        for v in order:
            agent = agents[v]
            t0 = time.perf_counter()
            for b in batches:
                info = agent.update(b)
            float(next(iter(info.values())))  # one host sync at the end of the block
            blocks[v].append((time.perf_counter() - t0) / a.updates)
    print(json.dumps({"ctrl_rl": ctrl_rl.__file__, "blocks": blocks, "matmul_flops": flops,
                      "s_per_update": {v: statistics.median(x) for v, x in blocks.items()}}))


def profile(a: argparse.Namespace) -> None:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.set_num_threads(a.threads)
    sample = replay(a.seed)
    agent = make_agent(a.profile, a.flow_hidden, a.seed)
    batches = [sample() for _ in range(a.updates)]
    for b in batches[:5]:
        agent.update(b)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches:
            agent.update(b)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    out = HERE / f"profile_{a.profile}{a.profile_suffix}.txt"
    out.write_text(f"# torch.profiler, {a.updates} updates of {a.profile} (flow widths {a.flow_hidden}), "
                   f"{a.threads} thread(s), ctrl_rl at {ROOT}\n{table}\n")
    print(table)


# ----- driver -----

def run_worker(tree: Path, a: argparse.Namespace, threads: int, seed: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--threads", str(threads),
           "--seed", str(seed), "--updates", str(a.updates), "--warmup", str(a.warmup), "--turns", str(a.turns),
           "--flow-hidden", str(a.flow_hidden), "--variants", *a.variants]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"worker in {tree} failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert Path(res["ctrl_rl"]).resolve().is_relative_to(tree.resolve()), f"ctrl_rl came from {res['ctrl_rl']}"
    return res


def markdown(p: dict) -> str:
    s = p["setting"]
    lines = [f"# SAC Flow update cost against SAC ({p['date']})", "",
             f"Seconds per `update(batch)` (critic + actor + temperature step), batch {s['batch']}, obs {OBS}, "
             f"action {ACT}; critics 2x256x256 for all; SAC actor 256x256; flows K=4 with widths "
             f"{s['flow_hidden']} (noise MLP {s['flow_hidden']}x{s['flow_hidden']}), Flow-T d_model 96, 2 layers. "
             f"{s['repeats']} workers per tree, {s['turns']} interleaved blocks of {s['updates']} updates each; "
             f"{p['machine']['cpus']} CPUs, load average before/after {p['load_before']} / {p['load_after']}; "
             f"script wall time {p['wall_s'] / 60:.1f} min.", ""]
    for tree, info in p["trees"].items():
        lines.append(f"- {tree}: `{info['path']}` at {info['head']}")
    lines += ["", "| tree | threads | variant | ms / update (median) | per worker "
              "| x SAC (median of per-worker ratios) |",
              "|---|---|---|---|---|---|"]
    for key, r in p["results"].items():
        tree, th = key.rsplit("@", 1)
        for v in s["variants"]:
            per = ", ".join(f"{x * 1e3:.2f}" for x in r["runs"][v])
            ratio = "" if v == "sac" else f"**{r['ratio_vs_sac'][v]:.2f}**"
            lines.append(f"| {tree} | {th} | {LABEL[v]} | {r['median_s'][v] * 1e3:.2f} | {per} | {ratio} |")
    lines += ["", "| tree | " + " | ".join(LABEL[v] for v in s["variants"]) + " |",
              "|---|" + "---|" * len(s["variants"])]
    for tree, f in p["matmul_flops_per_update"].items():
        lines.append(f"| {tree}: matmul MFLOP / update (x SAC) | " + " | ".join(
            f"{f[v] / 1e6:.0f} ({f[v] / f['sac']:.2f}x)" for v in s["variants"]) + " |")
    if "after_over_before" in p:
        lines += ["", "| threads | variant | after / before (ms per update) |", "|---|---|---|"]
        for th, d in p["after_over_before"].items():
            for v, x in d.items():
                lines.append(f"| {th} | {LABEL[v]} | {x:.3f} |")
    lines += ["", f"`{p['command']}`", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--before", type=Path, help="a git worktree of the code before the change (measured too)")
    ap.add_argument("--after", type=Path, default=ROOT, help="the tree under test (default: this checkout)")
    ap.add_argument("--tree", nargs="+", default=[], metavar="NAME=PATH",
                    help="more trees, measured between --before and --after (the effect of each change)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--turns", type=int, default=3, help="timed blocks per variant in a worker")
    ap.add_argument("--updates", type=int, default=30, help="updates per timed block")
    ap.add_argument("--warmup", type=int, default=10, help="untimed updates per variant before the blocks")
    ap.add_argument("--flow-hidden", type=int, default=256, help="flow widths (256: SAC's actor width; 512: defaults)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="sac_flow_speed", help="stem of the result files")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile", choices=VARIANTS, help="profile one variant's updates (torch.profiler) instead")
    ap.add_argument("--profile-suffix", default="", help="appended to the profile file's stem")
    a = ap.parse_args()
    if a.worker:
        a.threads = a.threads[0]
        return worker(a)
    if a.profile:
        a.threads = a.threads[0]
        return profile(a)
    if "sac" not in a.variants:
        a.variants = ["sac", *a.variants]
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    trees = {"before": a.before.resolve()} if a.before is not None else {}
    trees.update({n: Path(p).resolve() for n, p in (t.split("=", 1) for t in a.tree)})
    trees["after"] = a.after.resolve()
    runs: dict[str, dict[str, list[float]]] = {}
    flops: dict[str, dict[str, float]] = {}
    ratios: dict[str, dict[str, list[float]]] = {}
    for rep in range(a.repeats):
        order = list(trees) if rep % 2 == 0 else list(reversed(trees))
        for th in a.threads:
            for tree in order:
                res = run_worker(trees[tree], a, th, a.seed + rep)
                key = f"{tree}@{th}"
                s = res["s_per_update"]
                flops[tree] = res["matmul_flops"]
                for v in a.variants:
                    runs.setdefault(key, {}).setdefault(v, []).append(s[v])
                    if v != "sac":
                        ratios.setdefault(key, {}).setdefault(v, []).append(s[v] / s["sac"])
                print(f"repeat {rep} {key:10s} " + "  ".join(f"{LABEL[v]} {s[v] * 1e3:.2f} ms" for v in a.variants)
                      + f"  load {os.getloadavg()[0]:.2f}", flush=True)
    results = {k: {"runs": r, "median_s": {v: statistics.median(x) for v, x in r.items()},
                   "ratio_vs_sac": {v: statistics.median(x) for v, x in ratios[k].items()},
                   "ratio_vs_sac_per_worker": ratios[k]} for k, r in runs.items()}
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    payload = {
        "what": "seconds per SAC / SAC Flow update on synthetic Hopper-sized batches (experiments/sac_flow_speed)",
        "command": "python experiments/sac_flow_speed/sac_flow_speed.py " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "setting": {"obs": OBS, "action": ACT, "batch": BATCH, "critic_hidden": [256, 256],
                    "sac_actor_hidden": [256, 256], "flow_hidden": a.flow_hidden,
                    "noise_hidden": [a.flow_hidden, a.flow_hidden], "flow_steps": 4, "d_model": 96, "n_layers": 2,
                    "policy_delay": 1, "repeats": a.repeats, "turns": a.turns, "updates": a.updates,
                    "warmup": a.warmup, "threads": a.threads, "variants": a.variants},
        "trees": {k: {"path": str(p), "head": git_head(p)} for k, p in trees.items()},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        "uptime_after": uptime, "results": results, "matmul_flops_per_update": flops,
        "matmul_flops_vs_sac": {t: {v: f[v] / f["sac"] for v in f} for t, f in flops.items()},
        "wall_s": time.perf_counter() - t_start}
    if a.before is not None:
        payload["after_over_before"] = {
            str(th): {v: results[f"after@{th}"]["median_s"][v] / results[f"before@{th}"]["median_s"][v]
                      for v in a.variants} for th in a.threads}
    (HERE / f"{a.name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    (HERE / f"{a.name}.md").write_text(markdown(payload))
    print(markdown(payload))


if __name__ == "__main__":
    main()
