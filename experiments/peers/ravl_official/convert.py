"""A ctrl_rl dynamics model written as an official RAVL model folder, so that the official agent
(``train_ravl_agent.py``) imagines with the very model ctrl_rl's ``ravl`` uses: the two agents then differ in their
code only (issue 28, section 3).

    python experiments/peers/ravl_official/convert.py --ctrl-rl-model runs/d4rl/halfcheetah-medium-v5/dynamics \\
        --dataset halfcheetah-medium-v5 --seed 0 --out /work/peers/runs/hc-dyn-ctrl_rl
    python experiments/peers/ravl_official/run.py --stage agent ... --model /work/peers/runs/hc-dyn-ctrl_rl

Runs in ctrl_rl's venv (it reads ``model.pt``); the official side runs in the peer venv (``shim/from_ctrl_rl.py``:
the official ``Ensemble``, ``MeanStdevFilter``, ``DataBuffer`` and ``save_ensemble_model`` write the folder, and the
official ``load_ensemble_model`` reads it back).

The official member (``dynamics_training/net.py``) is the same network as a ctrl_rl member: 4 x 200 SiLU, inputs
standardised and clipped at 10 (ctrl_rl's ``INPUT_CLIP``), a mean head and a log-variance head with PETS' soft
clamp. Three things differ, and the conversion maps them:

* targets: ctrl_rl predicts standardised ``(s' - s, r)``; the official net raw ones. The mean head is scaled by the
  target std and shifted by the target mean; the log-variance head and both bounds are shifted by ``2 log(std)``,
  which the soft clamp carries through exactly (``clamp(x + c; lo + c, hi + c) = clamp(x; lo, hi) + c``).
  Means and, under the same bounds, log-variances are therefore the same function.
* bounds: ctrl_rl learns bounds per member (``[E, 1, D]``), the official code one pair for the ensemble (``[D]``).
  The conversion takes the median over members; the log-variances change where a member's own bounds differ, and
  ``convert.json`` reports by how much on ctrl_rl's holdout rows.
* elites: the official loader ranks members by raw (unstandardised) MSE on the validation buffer of ``data.pkl``;
  here that buffer holds ctrl_rl's holdout rows for ``--seed``, so both rank on the same rows (in their own units).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
from ctrl_rl.learn.checkpoint import load_checkpoint  # noqa: E402
from ctrl_rl.learn.model_based import MODEL_FILE  # noqa: E402
from ctrl_rl.world_models.ensemble import EnsembleDynamics  # noqa: E402

NAMES = ("fc1", "fc2", "fc3", "fc4")  # the official hidden layers, in order


def official_tensors(model: EnsembleDynamics) -> dict:
    """The official layout of a ctrl_rl ensemble: one ``Net`` state dict per member, the ensemble's log-variance
    bounds in raw units (median over members), the per-member bounds (to measure what the median changes), and
    the input filters' mean and std."""
    cfg = model.cfg
    if cfg.layer_norm or cfg.residual or cfg.activation != "silu" or len(set(cfg.hidden)) != 1 or len(cfg.hidden) != 4:
        raise SystemExit(f"convert.py: the model is {len(cfg.hidden)} x {cfg.hidden} {cfg.activation} (layer norm "
                         f"{cfg.layer_norm}, residual {cfg.residual}); expected the official architecture, 4 equal "
                         "SiLU layers without layer norm or residual connections")
    if model.max_logvar is None or model.min_logvar is None or cfg.learn_termination:
        raise SystemExit("convert.py: expected learned log-variance bounds and no termination head (the official "
                         "model has both bounds and no termination output)")
    D = model.out_dim
    m, s = model.target_mean.double(), model.target_std.double()  # [D]
    shift = 2 * torch.log(s)  # [D] log-variance in raw units = standardised + 2 log std
    lin = model.linears()
    members = []
    for i in range(model.num_members):
        sd = {}
        for name, layer in zip(NAMES, lin[:4]):
            sd[f"net.{name}.weight"] = layer.weight[i].T.contiguous()  # [out, in]
            sd[f"net.{name}.bias"] = layer.bias[i, 0].clone()
        w, b = lin[4].weight[i].double(), lin[4].bias[i, 0].double()  # [H, 2D], [2D]
        sd["net.delta.weight"] = (w[:, :D] * s).T.float().contiguous()
        sd["net.delta.bias"] = (b[:D] * s + m).float()
        sd["net.logvar.weight"] = w[:, D:2 * D].T.float().contiguous()
        sd["net.logvar.bias"] = (b[D:2 * D] + shift).float()
        members.append({k: v.detach().float() for k, v in sd.items()})
    hi = model.max_logvar.detach().double()[:, 0] + shift  # [E, D]
    lo = model.min_logvar.detach().double()[:, 0] + shift  # [E, D]
    return {"members": members, "logvar_max": hi.median(0).values.float(), "logvar_min": lo.median(0).values.float(),
            "member_logvar_max": hi.float(), "member_logvar_min": lo.float(),
            "state_mean": model.obs_mean.double(), "state_std": model.obs_std.double(),
            "action_mean": model.act_mean.double(), "action_std": model.act_std.double(),
            "elite_ids": model.elites.tolist(), "holdout_mse": model.holdout_mse.tolist()}


@torch.no_grad()
def reference(model: EnsembleDynamics, n: int = 4096, seed: int = 0) -> dict:
    """ctrl_rl's own predictions in raw units on probe inputs (states around and beyond the data, actions in
    [-1, 1]): next-state mean, reward mean and log-variance per member, the numbers the official side must give."""
    g = torch.Generator().manual_seed(seed)
    obs = model.obs_mean + model.obs_std * 1.5 * torch.randn(n, model.obs_dim, generator=g)  # [N,O]
    act = torch.rand(n, model.act_dim, generator=g) * 2 - 1  # [N,A]
    mean, logvar, _ = model(obs, act)  # [E,N,D] standardised
    raw = mean.double() * model.target_std.double() + model.target_mean.double()  # [E,N,D]
    raw[..., :model.obs_dim] += obs.double()  # the official get_mean_logvar returns s' (s + delta)
    lv = logvar.double() + 2 * torch.log(model.target_std.double())
    return {"probe_obs": obs, "probe_act": act, "expect_mean": raw.float(), "expect_logvar": lv.float()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ctrl-rl-model", required=True, help="a finished `ctrl-rl train dynamics` run (its model.pt)")
    p.add_argument("--dataset", required=True, help="the dataset it was fitted on, e.g. halfcheetah-medium-v5")
    p.add_argument("--seed", type=int, default=0, help="the fit's --seed (its holdout rows fill the validation buffer)")
    p.add_argument("--checkout", default="/work/peers/edge-of-reach", help="the official code's checkout")
    p.add_argument("--venv", default="/work/peers/ravl-venv", help="the peer venv (setup.sh)")
    p.add_argument("--out", required=True, help="the official model folder's parent (outside the repository)")
    a = p.parse_args()
    path = Path(a.ctrl_rl_model)
    path = path / MODEL_FILE if path.is_dir() else path
    if not path.is_file():
        raise SystemExit(f"convert.py: --ctrl-rl-model {a.ctrl_rl_model}: no {MODEL_FILE}; expected a finished "
                         "`ctrl-rl train dynamics` run")
    data = load_checkpoint(path)
    model = EnsembleDynamics.from_meta(data["meta"])
    model.load_state_dict(data["state"])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {**official_tensors(model), **reference(model), "source": str(path.resolve()), "dataset": a.dataset,
               "seed": a.seed}
    tensors_file = out / "ctrl_rl_tensors.pt"
    torch.save(tensors, tensors_file)
    py = Path(a.venv) / "bin" / "python"
    if not py.is_file():
        raise SystemExit(f"convert.py: --venv {a.venv}: no python there; run bash {HERE / 'setup.sh'} {a.venv}")
    subprocess.run([str(py), str(HERE / "shim" / "from_ctrl_rl.py"), a.checkout, str(tensors_file), a.dataset,
                    str(a.seed), str(out)], check=True)
    res = json.loads((out / "convert.json").read_text())
    print(f"convert.py: {res['model']} (means within {res['probe']['mean_max_abs']:.2g}; log-variance under the "
          f"members' own bounds within {res['probe']['logvar_own_bounds_max_abs']:.2g}, under the median bounds "
          f"{res['holdout']['logvar_median_bounds_mean_abs']:.3g} mean abs on the holdout rows)")
    if not math.isfinite(res["probe"]["mean_max_abs"]):
        raise SystemExit(2)


if __name__ == "__main__":
    main()
