"""The official side of ``convert.py`` (runs in the peer venv): a ctrl_rl ensemble in the official layout written
as an official model folder by the official code, checked, and read back by the official loader.

    python from_ctrl_rl.py CHECKOUT TENSORS.pt DATASET SEED OUT

TENSORS.pt is what ``convert.py`` saved (member state dicts, bounds, filter statistics, ctrl_rl's predictions on
probe inputs). Writes ``OUT/dynamics/model_<DATASET>_seed<SEED>_ctrl_rl/`` (``weights.pt``, ``data.pkl`` and the
``config.pkl`` link the official loader reads) and ``OUT/convert.json``:

* ``probe``: the official ``Net.get_mean_logvar`` (the rollout code's call) against ctrl_rl's predictions on the
  probes: next-state/reward means, and log-variances with each member's own bounds (both must agree to float
  rounding: the same function);
* ``holdout``: on ctrl_rl's holdout rows for SEED, how far the ensemble-wide (median) bounds move each member's
  log-variance from its own bounds;
* ``elites``: the members the official loader picks (raw MSE on the validation buffer = the same holdout rows)
  against ctrl_rl's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main() -> None:
    checkout, tensors_file, dataset, seed, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    sys.path[:0] = [str(HERE), checkout]
    import ravl_shim
    import torch
    from dynamics_training.ensemble import Ensemble, load_ensemble_model, save_ensemble_model
    from shared.data_buffer import DataBuffer
    from split import holdout_rows

    t = torch.load(tensors_file, weights_only=False)
    O, A, E, K = len(t["state_mean"]), len(t["action_mean"]), len(t["members"]), len(t["elite_ids"])
    D = O + 1
    # the official TrainConfig's fields (train_dynamics_model.py), as its own fits save them
    params = {"env_name": dataset, "seed": seed, "num_models": E, "num_elites": K, "filename": "ModelBased",
              "log_interval": 100, "train_memory": 2000000, "val_memory": 500000, "train_val_ratio": 0.2,
              "epochs": 0, "min_epochs": 0, "l2_reg_multiplier": 1.0, "model_lr": 0.001,
              "hidden_dim": int(t["members"][0]["net.fc1.weight"].shape[0]), "fix_std": False, "model_free": False,
              "var_max": False, "logvar_head": True, "save_model": True, "save_path": str(Path(out) / "dynamics"),
              "device": "cpu", "ob_dim": O, "ac_dim": A, "converted_from": t["source"]}
    ens = Ensemble(params)
    for filt, mean, std in ((ens.state_filter, t["state_mean"], t["state_std"]),
                            (ens.action_filter, t["action_mean"], t["action_std"])):
        filt.mean, filt.stdev = mean.numpy(), std.numpy()
        filt._update_torch()
    for i, sd in enumerate(t["members"]):
        ens.networks[i].load_state_dict(sd)  # strict: the official names and shapes
    ens.max_logvar, ens.min_logvar = t["logvar_max"], t["logvar_min"]

    def outputs(i: int, obs, act, own: bool):
        net = ens.networks[i]
        hi, lo = (t["member_logvar_max"][i], t["member_logvar_min"][i]) if own else (ens.max_logvar, ens.min_logvar)
        net.net.update_logvar_limits(hi, lo)
        net.eval()
        with torch.no_grad():
            ml = net.get_mean_logvar(obs, act, ens.state_filter, ens.action_filter)  # [B,2D]
        return ml[:, :D], ml[:, D:]

    probe = {"mean_max_abs": 0.0, "mean_max_rel": 0.0, "logvar_own_bounds_max_abs": 0.0,
             "logvar_median_bounds_max_abs": 0.0}
    for i in range(E):
        mean, lv_own = outputs(i, t["probe_obs"], t["probe_act"], own=True)
        _, lv_med = outputs(i, t["probe_obs"], t["probe_act"], own=False)
        want_m, want_lv = t["expect_mean"][i], t["expect_logvar"][i]
        err = (mean - want_m).abs()
        probe["mean_max_abs"] = max(probe["mean_max_abs"], float(err.max()))
        probe["mean_max_rel"] = max(probe["mean_max_rel"], float((err / want_m.abs().clamp_min(1.0)).max()))
        probe["logvar_own_bounds_max_abs"] = max(probe["logvar_own_bounds_max_abs"],
                                                 float((lv_own - want_lv).abs().max()))
        probe["logvar_median_bounds_max_abs"] = max(probe["logvar_median_bounds_max_abs"],
                                                    float((lv_med - want_lv).abs().max()))

    for key in ("RAVL_SHIM_EXCLUDE_ROWS", "RAVL_SHIM_MAX_ROWS"):
        os.environ.pop(key, None)
    data = ravl_shim.read_file(ravl_shim.dataset_file(dataset))
    ds = ravl_shim.qlearning_dataset(dataset=data)
    rows = holdout_rows(data, seed)
    val = {k: ds[k][rows] for k in ("observations", "actions", "rewards", "next_observations", "terminals")}
    obs, act = torch.as_tensor(val["observations"]), torch.as_tensor(val["actions"])
    diffs = []
    for i in range(E):
        d = torch.cat([(outputs(i, obs[s:s + 65536], act[s:s + 65536], own=False)[1]
                        - outputs(i, obs[s:s + 65536], act[s:s + 65536], own=True)[1]).abs()
                       for s in range(0, len(rows), 65536)])  # [H,D]
        diffs.append(d)
    d = torch.stack(diffs)  # [E,H,D]
    holdout = {"rows": int(len(rows)), "logvar_median_bounds_mean_abs": float(d.mean()),
               "logvar_median_bounds_p99_abs": float(torch.quantile(d.flatten()[::97], 0.99)),
               "logvar_median_bounds_mean_abs_per_member": d.mean((1, 2)).tolist(),
               "logvar_median_bounds_mean_abs_per_dim": d.mean((0, 1)).tolist(),
               "std_ratio_mean": float(torch.exp(0.5 * d).mean())}
    ens.set_model_logvar_limits()  # the ensemble-wide bounds, as the official loader sets them

    ens.memory = DataBuffer(action_dim=A, state_dim=O, buffer_size=1, as_numpy=True)  # the agent never reads it
    ens.memory_val.load_d4rl_dataset(val)  # the loader ranks the members on these rows
    ens.current_best_weights = [net.state_dict() for net in ens.networks.values()]
    ens.current_best_losses = np.asarray(t["holdout_mse"])  # ctrl_rl's (standardised) holdout MSE, for the record
    ens._model_id = f"model_{dataset}_seed{seed}_ctrl_rl"
    save_ensemble_model(ens, str(Path(out) / "dynamics"))
    model_dir = Path(out) / "dynamics" / ens._model_id
    (model_dir / "config.pkl").symlink_to("data.pkl")

    back = Ensemble(params)
    losses = load_ensemble_model(back, str(model_dir))
    fc1 = [sd["net.fc1.weight"] for sd in t["members"]]
    order = [next(j for j, w in enumerate(fc1) if torch.equal(net.state_dict()["net.fc1.weight"], w))
             for net in back.networks.values()]  # the loader's ranking, as ctrl_rl member ids
    elites = {"official": order[:K], "ctrl_rl": list(t["elite_ids"]), "official_raw_val_mse": losses.tolist(),
              "ranking_rows": "ctrl_rl's holdout rows for the seed (raw targets, the official unit)"}
    res = {"model": str(model_dir), "source": t["source"], "dataset": dataset, "seed": seed, "probe": probe,
           "probes": int(t["probe_obs"].shape[0]), "holdout": holdout, "elites": elites,
           "bounds": "official: one [D] pair, the median over members of ctrl_rl's per-member bounds (raw units)"}
    Path(out, "convert.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
