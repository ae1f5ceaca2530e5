"""The critics' Q against the true value of the policy, measured in the true simulator (edge-of-reach, bench 4).

For each run (a model-based SAC agent: mbpo, mopo, ravl), ``--states`` dataset states are drawn (seeded), the MuJoCo
simulator is set to each (``world_models.TrueDynamicsEnv`` from the dataset's ``infos/qpos``, ``infos/qvel``), an
action a ~ pi(.|s) is sampled, and

  Q(s, a)    the critics at (s, a): their mean and their minimum (the clipped target's view)
  G(s, a)    the Monte Carlo value of that action followed by the same stochastic policy in the real simulator:
             sum_t gamma^t r_t until termination or ``--horizon`` steps (gamma^horizon is the part left out); the
             soft value also subtracts alpha * gamma^t * log pi(a_t|s_t) for t >= 1, which is what a critic trained
             with the entropy bonus in its target estimates

so that Q / G says how far the critics overestimate the value of the policy they train. One rollout per state: G
is a single-sample estimate per state, averaged over the states.

    python experiments/edge_of_reach/q_truth.py runs/edge_of_reach/mbpo-s0 runs/edge_of_reach/ravl-s0 \
        [--dataset hopper-medium-v5] [--states 200] [--horizon 500] [--seed 0]

Writes experiments/edge_of_reach/q_truth.{md,json} and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import git_commit  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script


def measure(run_dir: Path, ds, states: int, horizon: int, seed: int) -> dict:
    from ctrl_rl.learn.evaluate import load_policy
    from ctrl_rl.world_models.true_dynamics import TrueDynamicsEnv

    algo, run, ck_path, ck = load_policy(str(run_dir), "cpu", seed=seed)
    cfg = algo.config
    gamma = float(cfg.gamma)
    env = TrueDynamicsEnv(run.env, ds.infos["qpos"], ds.infos["qvel"], states, horizon=horizon, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    alpha = float(algo.alpha)
    try:
        obs = env.reset(seed=seed)  # [N,O]
        with torch.no_grad():
            f = algo.encode(obs)
            a, _ = algo.actor.sample(f, gen)  # [N,A]
            q = algo.q(algo.critic, f, a)  # [E,N]
            ret = torch.zeros(states, dtype=torch.float64)  # [N]
            soft = torch.zeros(states, dtype=torch.float64)
            alive = torch.ones(states, dtype=torch.bool)
            disc = 1.0
            length = torch.zeros(states)
            for _t in range(horizon):
                out = env.step(a)
                r = out.reward.double()
                ret += alive * disc * r
                soft += alive * disc * r
                length += alive.float()
                alive &= ~(out.terminated | out.truncated)
                disc *= gamma
                if not bool(alive.any()):
                    break
                a, logp = algo.actor.sample(algo.encode(out.obs), gen)
                soft -= alive * disc * alpha * logp.double()
    finally:
        env.close()
    q_mean, q_min = q.mean(0).double(), q.min(0).values.double()  # [N]
    target = soft if cfg.backup_entropy else ret

    def corr(x: torch.Tensor, y: torch.Tensor) -> float:
        return float(torch.corrcoef(torch.stack([x, y]))[0, 1])

    return {"run": str(run_dir), "algo": ck.get("algo"), "step": int(ck.get("counters", {}).get("step", -1)),
            "checkpoint": str(ck_path), "states": states, "horizon": horizon, "gamma": gamma, "alpha": alpha,
            "backup_entropy": bool(cfg.backup_entropy), "num_critics": int(q.shape[0]),
            "q_mean": float(q_mean.mean()), "q_min": float(q_min.mean()), "mc_return": float(ret.mean()),
            "mc_soft": float(soft.mean()), "mc_target": float(target.mean()),
            "ratio_mean": float(q_mean.mean() / target.mean()), "ratio_min": float(q_min.mean() / target.mean()),
            "corr_q_mc": corr(q_mean, target), "mean_length": float(length.mean()),
            "terminated_within": float((length < horizon).float().mean()), "leftover_weight": gamma ** horizon}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--dataset", default="hopper-medium-v5")
    ap.add_argument("--states", type=int, default=200)
    ap.add_argument("--horizon", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    from ctrl_rl.storage.datasets import load_dataset

    torch.set_num_threads(1)
    ds = load_dataset(a.dataset)
    if "qpos" not in ds.infos or "qvel" not in ds.infos:
        raise SystemExit(f"{a.dataset} has no infos/qpos and infos/qvel: expected a `ctrl-rl data generate` dataset")
    rows = [measure(r, ds, a.states, a.horizon, a.seed) for r in a.runs]
    commit = git_commit()
    cmd = "python experiments/edge_of_reach/q_truth.py " + " ".join(str(r) for r in a.runs) + \
        f" --dataset {a.dataset} --states {a.states} --horizon {a.horizon} --seed {a.seed}"
    md = ["# The critics' Q against the true value of the policy (true simulator)", "",
          f"- Command: `{cmd}` ({datetime.date.today()}, commit {commit})",
          f"- {a.states} dataset states of `{a.dataset}`, one action a ~ pi(.|s) each; G: the discounted return of "
          f"that action and then the same stochastic policy in the real simulator, {a.horizon} steps at most "
          f"(gamma^{a.horizon} = {rows[0]['leftover_weight']:.4f} of the tail left out), soft G with the entropy "
          "bonus when the critic is trained with it (`backup_entropy`); means over the states", "",
          "| run | algo | step | critics | Q mean | Q min | G (return) | G (soft, the critic's target) | Q mean / G | "
          "Q min / G | corr(Q, G) over states | mean rollout length |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| `{r['run']}` | {r['algo']} | {r['step']:,} | {r['num_critics']} | {r['q_mean']:.1f} | "
                  f"{r['q_min']:.1f} | {r['mc_return']:.1f} | {r['mc_soft']:.1f} | {r['ratio_mean']:.2f} | "
                  f"{r['ratio_min']:.2f} | {r['corr_q_mc']:.2f} | {r['mean_length']:.0f} |")
    text = "\n".join(md) + "\n"
    (RESULTS / "q_truth.md").write_text(text)
    (RESULTS / "q_truth.json").write_text(json.dumps({"command": cmd, "rows": rows}, indent=1) + "\n")
    print(text)
    print(f"wrote {RESULTS / 'q_truth.md'}, q_truth.json")


if __name__ == "__main__":
    main()
