"""Why a model-based agent scores what it scores: model error along its own rollouts, what the penalty sees, and the
critics' Q against the policy's true value (issue 28, section 2: "find out why ... model error along rollouts,
Q-value growth, rollout length, penalty scale").

For an agent run (``ctrl-rl train mopo|ravl|mbpo ... --model RUN``) and its dynamics model, from ``--states``
dataset states (the simulator set to each from the dataset's ``infos/qpos``, ``infos/qvel``):

1. **Model error along the agent's rollouts.** The policy acts on the model's state, as in the agent's imagined
   rollouts (a random elite per step, sampled predictions); the real simulator executes the same actions from the
   same start. Per step t = 1..``--horizon``: the mean squared error of the model's state against the simulator's,
   in units of the dataset's per-dimension standard deviation; the absolute reward error; and the penalty's
   uncertainty figure (``aleatoric``: the largest predicted standard deviation norm, MOPO's; ``epistemic``) with its
   rank correlation with the reward error (is the penalty where the error is?). The steps past the agent's rollout
   length say how the error compounds; episodes the simulator terminates stop counting there.
2. **Penalty scale.** The agent's penalty weight times the uncertainty, against the model's reward, per step.
3. **Q against the truth.** ``experiments/edge_of_reach/q_truth.py``'s measurement on the same states: the critics'
   Q at (s, a ~ pi) over the Monte Carlo value of the policy in the real simulator.
4. **The critics' spread along the rollouts.** At each rollout step's start state s_(t-1) and the policy's action:
   the critics' mean, and how far their minimum lies below it (what a target's minimum over the ensemble, RAVL's
   pessimism, takes off). Row t = k + 1 is the state a k-step rollout ends in: bootstrapped from, never trained
   from (the edge of reach).

    python experiments/model_based_learning/diagnose.py RUN [RUN ...] [--states 500] [--horizon 25] [--seed 0]

Writes diagnose.{json,md,png} beside this script (``--name`` for another stem, ``--out`` for another folder).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # experiments/: common.py
sys.path.insert(0, str(HERE.parent / "edge_of_reach"))  # q_truth.py
from common import runs_commit, write_result  # noqa: E402


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Rank correlation of two [N] tensors (no tie correction; float noise makes ties rare)."""
    if x.numel() < 3:
        return float("nan")
    rx, ry = x.argsort().argsort().double(), y.argsort().argsort().double()
    return float(torch.corrcoef(torch.stack([rx, ry]))[0, 1])


def rollout_error(algo, model, true_env, term_fn, obs_std: torch.Tensor, horizon: int, penalty: float,
                  penalty_kind: str, gen: torch.Generator) -> list[dict]:
    """Per step: model-vs-simulator state error (std units), reward error, uncertainty, penalty, among the rollouts
    the simulator has not terminated (a terminated model rollout keeps being compared: its state is what the agent's
    buffer would hold up to there, and later steps are not in it, so they are masked as well)."""
    obs_true = true_env.reset(seed=int(torch.randint(2**31 - 1, (1,), generator=gen)))  # [N,O]
    obs_model = obs_true.clone()  # [N,O]
    n = obs_true.shape[0]
    alive = torch.ones(n, dtype=torch.bool)  # [N] neither the simulator nor the model has ended the rollout
    elites = model.elites
    rows = []
    critics = hasattr(algo, "q") and hasattr(algo, "critic")  # the SAC family (mopo, ravl, mbpo)
    for t in range(1, horizon + 1):
        with torch.no_grad():
            act = algo.act(obs_model, deterministic=False)  # [N,A]
            q = algo.q(algo.critic, algo.encode(obs_model), act) if critics else None  # [E,N] at s_(t-1)
            members = elites[torch.randint(elites.numel(), (n,), generator=gen)]  # [N]
            pred = model.predict(obs_model, act, members, sample=True, generator=gen)
        out = true_env.step(act)
        m_term = term_fn(obs_model, act, pred.next_obs) if term_fn is not None else torch.zeros(n, dtype=torch.bool)
        err = (((pred.next_obs - out.final_obs) / obs_std) ** 2).mean(1)  # [N] the true next state before any reset
        rerr = (pred.reward - out.reward).abs()  # [N]
        unc = pred.uncertainty.get(penalty_kind, torch.full((n,), float("nan")))  # [N]
        epi = pred.uncertainty.get("epistemic", torch.full((n,), float("nan")))
        a = alive
        if bool(a.any()):
            rows.append({"t": t, "alive": int(a.sum()), "state_mse_std": float(err[a].mean()),
                         "state_mse_std_median": float(err[a].median()),
                         "reward_abs_error": float(rerr[a].mean()), "reward_model": float(pred.reward[a].mean()),
                         "reward_true": float(out.reward[a].mean()), "uncertainty": float(unc[a].mean()),
                         "epistemic": float(epi[a].mean()), "penalty": penalty * float(unc[a].mean()),
                         "rank_corr_unc_reward_error": spearman(unc[a], rerr[a]),
                         "rank_corr_unc_state_error": spearman(unc[a], err[a]),
                         "terminated_true": float(out.terminated[a].float().mean()),
                         "terminated_model": float(m_term[a].float().mean())})
            if q is not None:
                qa = q[:, a].double()  # [E,n]
                rows[-1].update({"q_mean": float(qa.mean()),
                                 "q_mean_minus_min": float((qa.mean(0) - qa.min(0).values).mean()),
                                 "q_member_std": float(qa.std(0).mean()) if qa.shape[0] > 1 else 0.0})
        alive = alive & ~out.terminated & ~out.truncated & ~m_term
        obs_model = pred.next_obs
    return rows


def diagnose(run_dir: Path, a, ds) -> dict:
    from q_truth import measure

    from ctrl_rl.envs.registry import spec_of
    from ctrl_rl.learn.evaluate import load_policy
    from ctrl_rl.learn.model_based import load_model, termination_for
    from ctrl_rl.world_models.true_dynamics import TrueDynamicsEnv

    algo, run, _, ck = load_policy(str(run_dir), "cpu", seed=a.seed)
    loop = run.loop
    model_dir = a.model or getattr(loop, "model", None)
    if not model_dir or model_dir == "true":
        model_dir = str(run_dir / "dynamics")
    model = load_model(model_dir, spec_of(run.env), run.env, torch.device("cpu"))
    model.eval()
    term_fn = termination_for(run.env, model)
    obs_std = ds.obs.std(0).clamp_min(1e-6)  # [O]
    true_env = TrueDynamicsEnv(run.env, ds.infos["qpos"], ds.infos["qvel"], a.states, horizon=a.horizon,
                               seed=a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    penalty = float(getattr(loop, "penalty", 0.0) or 0.0)
    kind = str(getattr(loop, "penalty_kind", "aleatoric") or "aleatoric")
    try:
        steps = rollout_error(algo, model, true_env, term_fn, obs_std, a.horizon, penalty, kind, gen)
    finally:
        true_env.close()
    q = measure(run_dir, ds, a.states, a.q_horizon, a.seed)
    return {"run": str(run_dir), "algo": ck.get("algo"), "step": int(ck.get("counters", {}).get("step", -1)),
            "model": str(model_dir), "rollout_length": getattr(loop, "rollout_length", None), "penalty": penalty,
            "penalty_kind": kind, "steps": steps, "q_truth": q, "commit": runs_commit([run_dir])}


def markdown(p: dict) -> str:
    lines = ["# Model-based agents: model error along their rollouts, the penalty, Q against the truth", "",
             f"`{p['command']}` ({p['date']}); {p['states']} dataset states of `{p['dataset']}`, "
             f"model rollouts of {p['horizon']} steps driven by each agent's policy, compared step by step with the "
             "real simulator given the same actions.", ""]
    for r in p["runs"]:
        k = r["rollout_length"]
        q = r["q_truth"]
        lines += [f"## {r['algo']} `{r['run']}` at step {r['step']:,} (commit {r['commit']})", "",
                  f"Model `{r['model']}`; rollout length k = {k}; penalty {r['penalty']} x {r['penalty_kind']}. "
                  f"Critics' Q {q['q_mean']:.1f} against the policy's true value G {q['mc_target']:.1f} "
                  f"(**Q / G = {q['ratio_mean']:.2f}**, corr {q['corr_q_mc']:.2f}).", "",
                  "| t | alive | state MSE (std units) | median | reward error | model reward | true reward | "
                  "uncertainty | penalty | rank corr(unc, reward err) | rank corr(unc, state err) | "
                  "critics' Q at s_(t-1) | mean - min over critics |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for s in r["steps"]:
            if s["t"] <= 10 or s["t"] % 5 == 0:
                mark = " (k)" if s["t"] == k else " (edge)" if k and s["t"] == k + 1 else ""
                lines.append(f"| {s['t']}{mark} | {s['alive']} | {s['state_mse_std']:.4f} | "
                             f"{s['state_mse_std_median']:.4f} | {s['reward_abs_error']:.3f} | {s['reward_model']:.3f}"
                             f" | {s['reward_true']:.3f} | {s['uncertainty']:.3f} | {s['penalty']:.3f} | "
                             f"{s['rank_corr_unc_reward_error']:.2f} | {s['rank_corr_unc_state_error']:.2f} | "
                             f"{s.get('q_mean', float('nan')):.1f} | {s.get('q_mean_minus_min', float('nan')):.2f} |")
        lines.append("")
    return "\n".join(lines)


def plot(p: dict, dest: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    names = [Path(r["run"]).name for r in p["runs"]]
    if len(set(names)) < len(names):  # run folders name the runs (mopo-s0, ...) unless two share a name
        names = [r["algo"] for r in p["runs"]]
    for i, r in enumerate(p["runs"]):
        ts = [s["t"] for s in r["steps"]]
        lab = f"{names[i]} @{r['step']:,}"
        axes[0].plot(ts, [s["state_mse_std"] for s in r["steps"]], color=f"C{i}", label=lab)
        axes[1].plot(ts, [s["reward_abs_error"] for s in r["steps"]], color=f"C{i}", label=f"{lab} |error|")
        axes[1].plot(ts, [s["penalty"] for s in r["steps"]], "--", color=f"C{i}", label=f"{lab} penalty")
        axes[2].plot(ts, [s["rank_corr_unc_reward_error"] for s in r["steps"]], color=f"C{i}", label=lab)
        if r["rollout_length"]:
            for ax in axes[:3]:
                ax.axvline(r["rollout_length"], color="gray", ls=":", lw=0.8)
        q = r["q_truth"]
        axes[3].bar([2.5 * i, 2.5 * i + 1], [q["q_mean"], q["mc_target"]], color=f"C{i}",
                    hatch=["", "//"], edgecolor="black", linewidth=0.5)
    axes[3].set_xticks([2.5 * i + 0.5 for i in range(len(p["runs"]))],
                       [f"{n}\nQ / G = {r['q_truth']['ratio_mean']:.2f}" for n, r in zip(names, p["runs"])],
                       fontsize=7)
    axes[3].set_title("critics' Q (plain) against the true value G (hatched)")
    axes[3].grid(alpha=0.3, axis="y")
    axes[0].set_yscale("log")
    axes[0].set_title("model state error along the agent's rollouts (std units)")
    axes[1].set_title("reward: |model - simulator| and the penalty")
    axes[2].set_title("rank corr(uncertainty, reward error)")
    for ax in axes[:3]:
        ax.set_xlabel("rollout step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="agent run directories (mopo, ravl, mbpo)")
    ap.add_argument("--model", default=None, help="the dynamics run (default: the one each run trained with)")
    ap.add_argument("--dataset", default=None, help="default: the first run's dataset (needs infos/qpos, qvel)")
    ap.add_argument("--states", type=int, default=500)
    ap.add_argument("--horizon", type=int, default=25, help="model rollout steps compared with the simulator")
    ap.add_argument("--q-horizon", type=int, default=500, help="simulator steps of each true-value rollout")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="diagnose")
    ap.add_argument("--out", type=Path, default=HERE, help="folder of the result files (default: beside this script)")
    a = ap.parse_args(argv)
    from ctrl_rl.storage.datasets import load_dataset

    torch.set_num_threads(1)
    dataset = a.dataset or json.loads((a.runs[0] / "config.json").read_text())["run"]["dataset"]
    ds = load_dataset(dataset)
    if "qpos" not in ds.infos or "qvel" not in ds.infos:
        raise SystemExit(f"{dataset} has no infos/qpos and infos/qvel: expected a `ctrl-rl data generate` dataset")
    runs = [diagnose(r.resolve(), a, ds) for r in a.runs]
    payload = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
               "command": "python experiments/model_based_learning/diagnose.py " + " ".join(argv or sys.argv[1:]),
               "dataset": dataset, "states": a.states, "horizon": a.horizon, "runs": runs}
    write_result(a.name, payload, markdown(payload), folder=a.out)
    plot(payload, a.out / f"{a.name}.png")
    return payload


if __name__ == "__main__":
    main()
