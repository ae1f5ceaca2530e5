"""Benchmark: ModelEnv imagined env-steps/s, and one RAVL rollout round (k steps from 50k dataset states).

The model is ``ctrl_rl.world_models.ensemble.EnsembleDynamics`` with RAVL's shape (7 members, 5 elites, 4x200
SiLU), HalfCheetah-sized (obs 17, action 6), untrained weights and identity normalisers (timing does not depend on
the weights); ``--model standin`` swaps in a stand-in written here (``core.nets.EnsembleMLP`` of the same shape
with the protocol's uncertainty figures) for when ensemble.py is unusable. Start states: ``--envs`` random normal
"dataset" rows. Everything on the CPU, on ``--threads`` torch threads, under ``torch.no_grad``.

Timed in every repeat, one row after another (each repeat builds everything afresh with another seed), each after
one untimed call:

  predict       ``model.predict(obs, act, members, sample=True, generator)`` on N rows: the floor of a step
  step/step     ``ModelEnv.step`` with a random elite per transition (RAVL), uniform random actions
  step/episode  ``ModelEnv.step`` with one elite per imagined episode and NeuBay's truncation check
                (``truncate_above`` set, never reached)
  actor         one action sample of the actor below for N observations
  round         ``imagine(env, actor, k, buffer)``: reset (N new starts), k steps acting with the actor, every
                transition added to a FIFO ``ReplayBuffer`` of RAVL's capacity (N * k * 5); no terminations
                (HalfCheetah), so N * k transitions per round

Actor: a tanh-Gaussian MLP, 3x256 ReLU, outputs mean and log-std (clamped to [-5, 2]), samples with its own
generator (RAVL acts with the current stochastic actor).

    python experiments/world_models/model_env.py [--envs 50000] [--k 5] [--steps 3] [--repeats 5] [--threads 1]
                                          [--model ensemble|standin]

Writes experiments/world_models/model_env.json and .md and prints the table. Figures are medians over repeats.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

OBS_DIM, ACT_DIM, MEMBERS, ELITES, HIDDEN = 17, 6, 7, 5, (200, 200, 200, 200)


class StandIn(nn.Module):
    """Same shape and outputs as EnsembleDynamics (Gaussian heads over (s' - s, r), uncertainty over the elites),
    for timing only; used when ensemble.py is not importable."""

    def __init__(self):
        super().__init__()
        from ctrl_rl.core.nets import EnsembleMLP

        self.obs_dim, self.act_dim = OBS_DIM, ACT_DIM
        self.net = EnsembleMLP(MEMBERS, OBS_DIM + ACT_DIM, HIDDEN, 2 * (OBS_DIM + 1), "silu")
        self.register_buffer("elite_ids", torch.arange(ELITES))

    @property
    def elites(self) -> torch.Tensor:
        return self.elite_ids

    @property
    def num_members(self) -> int:
        return MEMBERS

    @torch.no_grad()
    def predict(self, obs, act, members=None, sample=True, generator=None):
        from ctrl_rl.world_models.protocol import ModelStep

        B, D = obs.shape[0], OBS_DIM + 1
        out = self.net(torch.cat([obs, act], -1))[: ELITES]  # [K,B,2D]
        mean, logvar = out[..., :D], out[..., D:].clamp(-10, 0.5)  # [K,B,D]
        pos = members if members is not None else torch.randint(ELITES, (B,), generator=generator)  # [B]
        rows = torch.arange(B)
        m, lv = mean[pos, rows], logvar[pos, rows]  # [B,D]
        if sample:
            m = m + torch.randn(m.shape, generator=generator) * (0.5 * lv).exp()
        var = logvar.exp()  # [K,B,D]
        epi = mean.var(0, unbiased=False)  # [B,D]
        unc = {"aleatoric": var.sum(-1).sqrt().amax(0), "epistemic": epi.mean(-1).sqrt(),
               "total_var": (epi + var.mean(0)).mean(-1)}
        return ModelStep(obs + m[:, :OBS_DIM], m[:, OBS_DIM], None, unc)


def make_model(kind: str, seed: int) -> tuple[nn.Module, str]:
    torch.manual_seed(seed)  # the untrained weights
    if kind == "ensemble":
        from ctrl_rl.world_models.ensemble import DynamicsConfig, EnsembleDynamics

        model = EnsembleDynamics(OBS_DIM, ACT_DIM, DynamicsConfig(members=MEMBERS, elites=ELITES, hidden=HIDDEN))
        with torch.no_grad():  # identity normalisers (the defaults, set explicitly)
            for name in ("obs", "act", "target"):
                getattr(model, f"{name}_mean").zero_()
                getattr(model, f"{name}_std").fill_(1.0)
        return model.eval(), "ctrl_rl.world_models.ensemble.EnsembleDynamics"
    return StandIn().eval(), "stand-in (core.nets.EnsembleMLP, this script)"


def make_actor(seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    from ctrl_rl.core.nets import mlp

    torch.manual_seed(seed)
    net = mlp(OBS_DIM, (256, 256, 256), 2 * ACT_DIM, "relu")
    gen = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def act(obs: torch.Tensor) -> torch.Tensor:
        mu, log_std = net(obs).chunk(2, -1)  # [N,A] each
        eps = torch.randn(mu.shape, generator=gen)  # [N,A]
        return torch.tanh(mu + log_std.clamp(-5, 2).exp() * eps)  # [N,A]

    return act


def timed(fn: Callable[[], object], n: int) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) per call of ``fn``, over ``n`` calls after one untimed call. On one torch
    thread the CPU time is the work itself, which other processes sharing the cores do not inflate as they do the
    wall time (the load average is in the .md)."""
    fn()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n, (time.process_time() - c) / n


def one_repeat(args, rep: int, kind: str) -> dict[str, float]:
    from ctrl_rl.storage.replay import ReplayBuffer
    from ctrl_rl.world_models.model_env import ModelEnv, imagine

    N, low, high = args.envs, [-1.0] * ACT_DIM, [1.0] * ACT_DIM
    model, _ = make_model(kind, rep)
    start = torch.randn(N, OBS_DIM, generator=torch.Generator().manual_seed(rep))  # [M,O] "dataset" states
    gen = torch.Generator().manual_seed(rep)
    act = torch.rand(N, ACT_DIM, generator=gen) * 2 - 1  # [N,A]
    obs = start[torch.randperm(N, generator=gen)]  # [N,O]
    members = model.elites[torch.randint(ELITES, (N,), generator=gen)]  # [N]
    env_step = ModelEnv(model, start, N, low, high, "HalfCheetah-v5", member_mode="step", seed=rep)
    env_ep = ModelEnv(model, start, N, low, high, "HalfCheetah-v5", member_mode="episode", truncate_above=1e30,
                      seed=rep)
    actor = make_actor(rep)
    buffer = ReplayBuffer(N * args.k * 5, (OBS_DIM,), ACT_DIM)
    out, stats = {}, {}
    with torch.no_grad():
        calls = {"predict": (lambda: model.predict(obs, act, members, sample=True, generator=gen), args.steps),
                 "step_mode": (lambda: env_step.step(act), args.steps),
                 "episode_mode": (lambda: env_ep.step(act), args.steps),
                 "actor": (lambda: actor(obs), args.steps),
                 "round": (lambda: stats.update(imagine(env_step, actor, args.k, buffer)), 1)}
        for name, (fn, n) in calls.items():
            out[f"{name}_s"], out[f"{name}_cpu_s"] = timed(fn, n)
    assert stats["rollout/transitions"] == N * args.k, stats
    out["round_transitions"] = stats["rollout/transitions"]
    for name in calls:
        rows = out["round_transitions"] if name == "round" else N  # env-steps (rows) per call
        out[f"{name}_per_s"], out[f"{name}_per_cpu_s"] = rows / out[f"{name}_s"], rows / out[f"{name}_cpu_s"]
    return out


def markdown(med: dict, runs: list[dict], args, meta: dict) -> str:
    N, k = args.envs, args.k
    rows = [("model.predict (floor of a step)", "predict", "rows/s"),
            ("ModelEnv.step, member per step (RAVL)", "step_mode", "env-steps/s"),
            ("ModelEnv.step, member per episode + truncation check (NeuBay)", "episode_mode", "env-steps/s"),
            ("actor sample, 3x256 tanh-Gaussian", "actor", "rows/s"),
            (f"imagine round: reset + {k} steps + {N * k:,} buffer adds", "round", "transitions/s")]
    lines = [f"| what ({N:,} envs) | wall s (median) | wall s, repeats | CPU s (median) | rate per wall s | "
             "rate per CPU s |", "|---|---|---|---|---|---|"]
    for name, key, unit in rows:
        reps = ", ".join(f"{x[key + '_s']:.2f}" for x in runs)
        lines.append(f"| {name} | {med[key + '_s']:.3f} | {reps} | {med[key + '_cpu_s']:.3f} | "
                     f"{med[key + '_per_s']:,.0f} {unit} | {med[key + '_per_cpu_s']:,.0f} {unit} |")
    over = med["step_mode_cpu_s"] / med["predict_cpu_s"] - 1
    lines += ["", f"`python experiments/world_models/model_env.py --envs {N} --k {k} --steps {args.steps} --repeats "
              f"{args.repeats} --threads {args.threads} --model {args.model}`", "",
              f"Model: {meta['model']} ({MEMBERS} members, {ELITES} elites, {'x'.join(map(str, HIDDEN))} SiLU, obs "
              f"{OBS_DIM}, action {ACT_DIM}, untrained, identity normalisers); {N:,} random start states; "
              f"{args.threads} torch thread(s); torch {meta['torch']}, {meta['cpus']} CPUs, load average "
              f"{meta['loadavg_start']} at start and {meta['loadavg_end']} at end. Medians of {args.repeats} repeats; "
              f"step and predict rows time {args.steps} calls each.", "",
              f"ModelEnv's own cost over the bare predict (member draw, penalty, finite check, termination, "
              f"auto-reset draws), in CPU time: {over:+.1%}. A round's time is about k x (actor + step) plus the "
              f"buffer copies.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", type=int, default=50_000, help="N: parallel imagined rollouts = start states")
    ap.add_argument("--k", type=int, default=5, help="rollout length of a round (RAVL's k)")
    ap.add_argument("--steps", type=int, default=3, help="timed calls per step/predict/actor row and repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", choices=["ensemble", "standin"], default="ensemble")
    args = ap.parse_args()
    threads_on_entry = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    _, model_name = make_model(args.model, 0)
    meta = {"model": model_name, "torch": torch.__version__, "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_start": round(os.getloadavg()[0], 2)}
    runs = []
    for rep in range(args.repeats):
        runs.append(one_repeat(args, rep, args.model))
        r = runs[-1]
        print(f"repeat {rep}: step {r['step_mode_per_s']:,.0f} env-steps/s "
              f"({r['step_mode_per_cpu_s']:,.0f} per CPU s), "
              f"episode {r['episode_mode_per_s']:,.0f}, predict {r['predict_s']:.3f} s, round {r['round_s']:.2f} s "
              f"({r['round_cpu_s']:.2f} CPU s)", flush=True)
    torch.set_num_threads(threads_on_entry)
    meta["loadavg_end"] = round(os.getloadavg()[0], 2)
    med = {f: statistics.median(r[f] for r in runs) for f in runs[0]}
    assert all(math.isfinite(v) for v in med.values())
    payload = {"setting": {"envs": args.envs, "k": args.k, "steps": args.steps, "repeats": args.repeats,
                           "threads": args.threads, "obs_dim": OBS_DIM, "act_dim": ACT_DIM, "members": MEMBERS,
                           "elites": ELITES, "hidden": list(HIDDEN), "actor": "3x256 ReLU tanh-Gaussian", **meta},
               "runs": runs, "median": med}
    md = markdown(med, runs, args, meta)
    print(md)
    write_result("model_env", payload, md, folder=RESULTS)


if __name__ == "__main__":
    main()
