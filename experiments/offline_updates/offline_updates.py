"""Benchmark: offline gradient steps/s of CQL and IQL, ctrl_rl vs d3rlpy, same networks, batch and data.

Both libraries train on one synthetic HalfCheetah-sized dataset held in memory (obs 17, action 6, 100k
transitions of random numbers, an episode boundary (time-out) every 1000 steps; no file is read), on the
CPU, in one process, on ``--threads`` torch threads. A step is what each library's own offline loop does
per gradient step:

  ctrl_rl   ``algo.update(buffer.sample(256, gen))`` with the buffer from
            ``ctrl_rl.storage.datasets.to_replay`` (ctrl_rl.learn.offline's loop, without its logging)
  d3rlpy    ``algo.update(dataset.sample_transition_batch(256))`` on a ``d3rlpy.dataset.MDPDataset``:
            the two calls ``QLearningAlgoBase.fitter`` makes per step, without its logger and tqdm
            (``update`` converts the NumPy batch to tensors and returns floats; that is d3rlpy's cost)

The variants of one algorithm are built from the same seed, warmed up (``--warmup`` steps, not timed) and
then run in turns of ``--block`` steps until each has done ``--steps``, so that drifts of the machine's
speed (other jobs share its cores) hit every variant alike. Sampling and update are timed separately with
the same clock around the same calls on both sides: steps/s counts both, update-only steps/s the update.
Each repeat builds everything afresh with another seed; the tables give medians over ``--repeats``.

Settings matched (d3rlpy 2.8.1 names in brackets):
  both      actor and every critic (and IQL's value net) 2x256 ReLU MLPs [VectorEncoderFactory(hidden_units=
            [256, 256])], batch 256, gamma 0.99, Polyak tau 0.005, Adam, no LayerNorm / dropout / batch norm,
            no gradient clipping, no observation / reward scaling
  CQL       2 critics, all of them in the target min and in the CQL term [n_critics=2]; 10 actions of each
            kind (uniform, pi(s), pi(s')) evaluated at s with importance-sampling densities inside the
            logsumexp [n_action_samples=10]; fixed CQL weight 5 [conservative_weight=5, initial_alpha=1,
            alpha_learning_rate=0: no Lagrange]; no max-target backup [max_q_backup=False]; no entropy term in
            the TD target (backup_entropy=False) [soft_q_backup=False]; learned SAC temperature from 1.0;
            learning rates actor 1e-4, critic 3e-4, temperature 1e-4 (d3rlpy's defaults; ctrl_rl's CQLConfig
            has the same); ctrl_rl's WSRL-only options off: layer_norm, actor_layer_norm,
            final_hidden_scale=1, max_target_backup, calql
  IQL       2 critics (min), expectile 0.7, inverse temperature 3, weight clip 100, learning rates 3e-4,
            state-independent log-std, mean tanh(mu(s)); ctrl_rl's actor cosine schedule off
            (cosine_steps=None: d3rlpy has none by default)

Not matched (each library keeps its own way). Dense FLOPs per step, counted with torch.utils.flop_counter:
CQL 7.04 GFLOP ctrl_rl vs 7.37 d3rlpy (cql_wsrl 9.15), IQL 0.57 vs 0.65.
  CQL    d3rlpy's TD target uses the deterministic action tanh(mu(s')), ctrl_rl a sample a' ~ pi(s');
         d3rlpy sums TD and CQL losses over the critics, ctrl_rl averages them (a factor 2 in the loss);
         d3rlpy evaluates Q(s, a_data) twice (TD and CQL term) and takes critic weight gradients in the actor
         step, ctrl_rl does neither; log-std clamp [-20, 2] vs [-5, 2]; ctrl_rl clips dataset actions to
         +-0.99999 (the synthetic actions lie inside); initialisations differ (no effect on speed)
  IQL    d3rlpy steps Q and V with one optimizer on losses from the same parameters, then the actor;
         ctrl_rl steps V, then the actor, then Q (the official code's order: three backward passes);
         d3rlpy evaluates the target critics and V(s) twice (value loss and advantage weights)
  both   d3rlpy keeps one nn.Module per critic and loops over them in Python, with torch's default
         (for-loop) Adam on CPU; ctrl_rl stacks the critics in one batched matmul and uses fused Adam.
         That is the libraries' design, and what is being compared.

Extra row ``cql_wsrl``: ctrl_rl's CQLConfig defaults (WSRL's locomotion pre-training: 10 critics, subset 2 in
the target and CQL term, LayerNorm in actor and critics, max-target backup over 10 actions); its ratio is
against d3rlpy's 2-critic CQL measured in the same turns, so it is not like-for-like.

    python experiments/offline_updates/offline_updates.py [--steps 2000] [--repeats 3] [--threads 1 [2]]
                                                [--algos cql iql cql_wsrl] [--warmup 50] [--block 100]

Writes experiments/offline_updates/offline_updates.json and .md and prints the table.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import write_result  # noqa: E402
from peers import d3rlpy_runs  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

OBS_DIM, ACTION_DIM, EPISODE_LEN, BATCH = 17, 6, 1000, 256
HIDDEN = [256, 256]
ALGOS = {"cql": "cql", "cql_wsrl": "cql", "iql": "iql",  # variant -> the d3rlpy algorithm it is timed with
         "cql_bf16": "cql", "cql_wsrl_bf16": "cql", "iql_bf16": "iql"}
# "<variant>_bf16": ctrl_rl's variant with ``--matmul-precision medium`` (float32 matmuls on bfloat16 inputs through
# oneDNN, AMX on this CPU): not matched to d3rlpy, which runs float32 products; set around each of its updates only


# ----- data -----

def synthetic_arrays(transitions: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random HalfCheetah-sized transitions, a time-out every EPISODE_LEN steps, no terminations."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((transitions, OBS_DIM), dtype=np.float32)  # [S,O]
    action = np.tanh(rng.standard_normal((transitions, ACTION_DIM), dtype=np.float32))  # [S,A] inside (-1, 1)
    reward = rng.standard_normal(transitions, dtype=np.float32)  # [S]
    terminal = np.zeros(transitions, dtype=np.float32)  # [S]
    timeout = np.zeros(transitions, dtype=np.float32)  # [S]
    timeout[EPISODE_LEN - 1::EPISODE_LEN] = 1.0
    timeout[-1] = 1.0
    return {"obs": obs, "action": action, "reward": reward, "terminal": terminal, "timeout": timeout}


def ctrl_rl_buffer(arrays: dict[str, np.ndarray]):
    """The arrays as an OfflineDataset laid out like a D4RL file without next_observations (an episode's last
    row has no next observation and is dropped), then ``to_replay``."""
    from ctrl_rl.storage.datasets import OfflineDataset, to_replay

    obs = torch.from_numpy(arrays["obs"])  # [S,O]
    ends = torch.from_numpy(arrays["timeout"]).bool()  # [S]
    next_obs = torch.cat([obs[1:], obs[-1:]])  # [S,O]
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), ends.nonzero().squeeze(1) + 1])  # [K+1]
    ds = OfflineDataset(obs, torch.from_numpy(arrays["action"]), torch.from_numpy(arrays["reward"]), next_obs,
                        torch.from_numpy(arrays["terminal"]).bool(), ends, offsets, next_obs_valid=~ends,
                        metadata={"source": "synthetic"})
    return to_replay(ds, "cpu")


# ----- the two libraries -----

@dataclass
class Runner:
    """One (algorithm, library) variant: how it draws a batch and takes a gradient step on it."""

    name: str
    sample: Callable[[], Any]
    update: Callable[[Any], Any]


def ctrl_rl_runner(name: str, buffer, seed: int) -> Runner:
    from ctrl_rl.algos import registry
    from ctrl_rl.envs.protocol import EnvSpec

    variant = name.removesuffix("_bf16")

    spec = EnvSpec("synthetic:halfcheetah-sized", (OBS_DIM,), False, ACTION_DIM, (-1.0,) * ACTION_DIM,
                   (1.0,) * ACTION_DIM)
    if variant == "iql":
        from ctrl_rl.algos.iql import IQLConfig

        cfg = IQLConfig(num_critics=2, expectile=0.7, beta=3.0, weight_clip=100.0, actor_lr=3e-4, critic_lr=3e-4,
                        value_lr=3e-4, cosine_steps=None)
    else:
        from ctrl_rl.algos.cql import CQLConfig

        cfg = registry.get("cql").default_config() if variant == "cql_wsrl" else CQLConfig(
            num_critics=2, target_subset=2, layer_norm=False, actor_layer_norm=False, final_hidden_scale=1.0,
            actor_lr=1e-4, critic_lr=3e-4, alpha_lr=1e-4, init_alpha=1.0, backup_entropy=False, alpha_cql=5.0,
            lagrange=False, num_cql_samples=10, importance_sampling=True, max_target_backup=False, calql=False)
    gen = torch.Generator().manual_seed(seed)
    algo = registry.get(ALGOS[variant]).make(cfg, spec, torch.device("cpu"), gen)
    if name == variant:
        return Runner(f"ctrl_rl/{name}", lambda: buffer.sample(BATCH, gen), lambda b: algo.update(b))

    def update_bf16(b):
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("medium")
        try:
            return algo.update(b)
        finally:
            torch.set_float32_matmul_precision(before)

    return Runner(f"ctrl_rl/{name}", lambda: buffer.sample(BATCH, gen), update_bf16)


# ----- timing -----

def run_steps(r: Runner, n: int) -> tuple[float, float]:
    """``n`` steps of ``r``; returns (seconds in total, seconds of it spent sampling)."""
    sampling = 0.0
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        batch = r.sample()
        sampling += time.perf_counter() - t
        r.update(batch)
    return time.perf_counter() - t0, sampling


def step_flops(r: Runner) -> float:
    """Dense FLOPs of one step of ``r`` (one sample and update, counted by torch.utils.flop_counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        r.update(r.sample())
    return float(fc.get_total_flops())


def matmul_peak(threads: int, repeats: int = 5, n: int = 200) -> float:
    """GFLOP/s of the float32 matmul that dominates both libraries' CQL step, (2560 x 256) @ (256 x 256), on
    ``threads`` threads: the median of ``repeats`` timings of ``n`` products. A step cannot run faster than its
    FLOPs at this rate, whatever the library."""
    torch.set_num_threads(threads)
    a, b = torch.randn(BATCH * 10, HIDDEN[0]), torch.randn(HIDDEN[0], HIDDEN[1])
    for _ in range(10):
        a @ b
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            a @ b
        rates.append(2 * a.shape[0] * a.shape[1] * b.shape[1] * n / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def measure(runners: list[Runner], steps: int, warmup: int, block: int) -> dict[str, dict[str, float]]:
    """Warm every runner up, then run them in turns of ``block`` steps; steps/s of each (with and without
    sampling) and its mean sampling time."""
    flops = {r.name: step_flops(r) for r in runners}
    for r in runners:
        run_steps(r, warmup)
    total = {r.name: 0.0 for r in runners}
    sampling = {r.name: 0.0 for r in runners}
    done = 0
    while done < steps:
        n = min(block, steps - done)
        for r in runners:
            t, s = run_steps(r, n)
            total[r.name] += t
            sampling[r.name] += s
        done += n
    return {r.name: {"steps_per_s": steps / total[r.name],
                     "update_steps_per_s": steps / (total[r.name] - sampling[r.name]),
                     "sample_ms": 1e3 * sampling[r.name] / steps, "gflop_per_step": flops[r.name] / 1e9,
                     "gflop_per_s": flops[r.name] * steps / total[r.name] / 1e9} for r in runners}


def markdown(med: dict[str, dict], runs: dict[str, list[dict]], args: argparse.Namespace, versions: dict) -> str:
    lines = ["| algo | library | threads | steps/s (median) | repeats | ratio vs d3rlpy | update-only steps/s (median) "
             "| update-only ratio | sampling ms/step | GFLOP/step | GFLOP/s | of matmul peak |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, m in med.items():
        variant, lib, th = key.split("/")
        base = med.get(f"{ALGOS[variant]}/d3rlpy/{th}")
        ratio = f"{m['steps_per_s'] / base['steps_per_s']:.2f}x" if base and lib == "ctrl_rl" else "-"
        uratio = f"{m['update_steps_per_s'] / base['update_steps_per_s']:.2f}x" if base and lib == "ctrl_rl" else "-"
        reps = ", ".join(f"{x['steps_per_s']:.1f}" for x in runs[key])
        lines.append(f"| {variant} | {lib} | {th} | {m['steps_per_s']:.1f} | {reps} | {ratio} | "
                     f"{m['update_steps_per_s']:.1f} | {uratio} | {m['sample_ms']:.2f} | {m['gflop_per_step']:.2f} | "
                     f"{m['gflop_per_s']:.1f} | {m['gflop_per_s'] / versions['matmul_peak'][th]:.0%} |")
    load = versions.get("loadavg_start"), versions.get("loadavg_end")
    lines += ["", f"`python experiments/offline_updates/offline_updates.py --steps {args.steps} "
              f"--repeats {args.repeats} "
              f"--threads {' '.join(map(str, args.threads))} --algos {' '.join(args.algos)}`; warm-up {args.warmup} "
              f"steps, turns of {args.block} steps; {args.transitions} synthetic transitions (obs {OBS_DIM}, action "
              f"{ACTION_DIM}), batch {BATCH}, 2x256 ReLU. torch {versions['torch']}, d3rlpy {versions['d3rlpy']}, "
              f"{versions['cpus']} CPUs, load average {load[0]} at start and {load[1]} at end.",
              *(["cql_wsrl (10 critics, subset 2, LayerNorm, max-target backup) is compared with d3rlpy's "
                 "2-critic CQL: not like-for-like."] if "cql_wsrl" in args.algos else []),
              "Matmul peak (median GFLOP/s of a float32 (2560x256)@(256x256) product, measured in this run): "
              + ", ".join(f"{v:.1f} on {k} thread(s)" for k, v in versions["matmul_peak"].items())
              + ". A step takes at least its FLOPs at that rate: a CQL step that runs near the peak in both libraries "
              "cannot be made 2x faster by the code around it, only by doing fewer FLOPs."]
    for key, m in med.items():
        variant, lib, th = key.split("/")
        base = med.get(f"{ALGOS[variant]}/d3rlpy/{th}")
        if lib == "ctrl_rl" and base and variant in ("cql", "iql"):
            need = 2 * base["steps_per_s"] * m["gflop_per_step"]
            lines.append(f"- {variant}, {th} thread(s): 2x d3rlpy is {2 * base['steps_per_s']:.1f} steps/s, i.e. "
                         f"{need:.1f} GFLOP/s at ctrl_rl's {m['gflop_per_step']:.2f} GFLOP/step: "
                         f"{need / versions['matmul_peak'][th]:.0%} of the matmul peak (now {m['gflop_per_s']:.1f}, "
                         f"{m['gflop_per_s'] / versions['matmul_peak'][th]:.0%}).")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2000, help="timed gradient steps per variant and repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--algos", nargs="+", default=["cql", "iql", "cql_wsrl"], choices=list(ALGOS))
    ap.add_argument("--warmup", type=int, default=50, help="untimed steps per variant before timing")
    ap.add_argument("--block", type=int, default=100, help="steps per turn when the variants alternate")
    ap.add_argument("--transitions", type=int, default=100_000)
    ap.add_argument("--name", default="offline_updates", help="stem of the result files")
    args = ap.parse_args()
    import d3rlpy
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))  # d3rlpy's info lines
    versions = {"torch": torch.__version__, "d3rlpy": d3rlpy.__version__, "numpy": np.__version__,
                "python": platform.python_version(), "cpus": os.cpu_count(),
                "loadavg_start": round(os.getloadavg()[0], 2)}
    arrays = synthetic_arrays(args.transitions)
    buffer, dataset = ctrl_rl_buffer(arrays), d3rlpy_runs.mdp_dataset(arrays)
    assert len(buffer) == dataset.transition_count, (len(buffer), dataset.transition_count)
    threads_on_entry = torch.get_num_threads()
    versions["matmul_peak"] = {str(th): round(matmul_peak(th), 1) for th in args.threads}
    runs: dict[str, list[dict]] = {}
    groups = {"cql": [v for v in args.algos if ALGOS[v] == "cql"], "iql": [v for v in args.algos if ALGOS[v] == "iql"]}
    for rep in range(args.repeats):
        for th in args.threads:
            torch.set_num_threads(th)
            for algo_name, variants in groups.items():
                if not variants:
                    continue
                theirs = Runner(f"d3rlpy/{algo_name}", *d3rlpy_runs.update_fns(algo_name, dataset, rep, HIDDEN, BATCH))
                runners = [ctrl_rl_runner(v, buffer, rep) for v in variants] + [theirs]
                res = measure(runners, args.steps, args.warmup, args.block)
                for name, m in res.items():
                    lib, variant = name.split("/")
                    runs.setdefault(f"{variant}/{lib}/{th}", []).append(m)
                print(f"repeat {rep} threads {th}: "
                      + ", ".join(f"{k} {v['steps_per_s']:.1f} steps/s" for k, v in res.items()),
                      flush=True)
    torch.set_num_threads(threads_on_entry)
    versions["loadavg_end"] = round(os.getloadavg()[0], 2)
    med = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} for k, v in runs.items()}
    ratios = {}
    for key, m in med.items():
        variant, lib, th = key.split("/")
        base = med.get(f"{ALGOS[variant]}/d3rlpy/{th}")
        if lib == "ctrl_rl" and base:
            ratios[key] = {"steps_per_s": m["steps_per_s"] / base["steps_per_s"],
                           "update_steps_per_s": m["update_steps_per_s"] / base["update_steps_per_s"]}
    payload = {"setting": {"data": f"synthetic, {args.transitions} transitions, obs {OBS_DIM}, action {ACTION_DIM}, "
                                   f"time-out every {EPISODE_LEN} steps", "hidden": HIDDEN, "batch": BATCH,
                           "steps": args.steps, "warmup": args.warmup, "block": args.block, "repeats": args.repeats,
                           "threads": args.threads, "versions": versions},
               "runs": runs, "median": med, "ratio_ctrl_rl_vs_d3rlpy": ratios, "target": "ctrl_rl >= 2x d3rlpy"}
    md = markdown(med, runs, args, versions)
    print(md)
    write_result(args.name, payload, md, folder=RESULTS)


if __name__ == "__main__":
    main()
