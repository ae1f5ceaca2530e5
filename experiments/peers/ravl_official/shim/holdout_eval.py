"""Holdout MSE of an ensemble that the official ``train_dynamics_model.py`` saved, on given dataset rows:

    python holdout_eval.py CHECKOUT MODEL_DIR DATASET ROWS.npy OUT.json

ROWS are indices into the dataset's qlearning view (``ravl_shim.qlearning_dataset``), rows the fit never saw
(``run.py --holdout-rows`` held them out of its data). The model is loaded with the official loader
(``load_ensemble_model``; it needs ``config.pkl``, which run.py links to the saved ``data.pkl``). Two units:

* raw: mean over rows and the O+1 targets (s' - s, r) of (target - predicted mean)^2, the official code's
  ``Validation Losses`` (``GaussianMSELoss(logvar_loss=False)``: its targets are not standardised);
* standardised: every target dim divided by its population std over the other rows of the view (the training
  split when ROWS is ctrl_rl's holdout), ctrl_rl's ``holdout_mse`` units (world_models/ensemble.py).

Per member and over the elites (the official choice: the 5 members with the lowest raw validation loss, which
its loader picks on the validation buffer saved in data.pkl).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main() -> None:
    checkout, model_dir, dataset, rows_file, out = sys.argv[1:6]
    sys.path[:0] = [str(Path(__file__).resolve().parent), checkout]
    import pickle

    import ravl_shim
    import torch
    from dynamics_training.ensemble import Ensemble, load_ensemble_model

    params = pickle.load(open(Path(model_dir) / "config.pkl", "rb"))["params"]
    ens = Ensemble(params)
    load_ensemble_model(ens, model_dir)  # sorts the members by the saved split's loss; elites = the first K
    ds = ravl_shim.qlearning_dataset(dataset=ravl_shim.read_file(ravl_shim.dataset_file(dataset)))
    rows = np.load(rows_file)
    y = np.concatenate([ds["next_observations"] - ds["observations"], ds["rewards"][:, None]], 1)  # [S,D]
    others = np.ones(len(y), dtype=bool)
    others[rows] = False
    sd = y[others].std(0)  # [D] population std of the training rows' targets
    sd = np.where(sd < 1e-12, 1.0, sd)
    obs = torch.as_tensor(ds["observations"][rows])  # [H,O]
    act = torch.as_tensor(ds["actions"][rows])  # [H,A]
    target = torch.as_tensor(y[rows])  # [H,D]
    sq_sum = torch.zeros(ens.num_models, y.shape[1], dtype=torch.float64)  # [E,D]
    with torch.no_grad():
        for s in range(0, len(rows), 65536):
            o, a, t = obs[s:s + 65536], act[s:s + 65536], target[s:s + 65536]
            x = torch.cat([ens.state_filter.filter_torch(o), ens.action_filter.filter_torch(a)], 1).float()
            for i, net in ens.networks.items():
                net.eval()
                mu = net.forward(x)[:, : y.shape[1]]  # [B,D] raw (s' - s, r)
                sq_sum[i] += ((t - mu) ** 2).sum(0).double()
    per_dim = (sq_sum / len(rows)).numpy()  # [E,D]
    raw = per_dim.mean(1)  # [E]
    std = (per_dim / sd**2).mean(1)  # [E]
    k = ens.num_elites
    result = {"rows": int(len(rows)), "rows_file": str(rows_file), "members_in_elite_order": ens.num_models,
              "raw_mse": raw.tolist(), "raw_mse_elites": float(raw[:k].mean()),
              "raw_mse_best_k": float(np.sort(raw)[:k].mean()), "raw_mse_per_dim_elites": per_dim[:k].mean(0).tolist(),
              "standardised_mse": std.tolist(), "standardised_mse_elites": float(std[:k].mean()),
              "standardised_mse_best_k": float(np.sort(std)[:k].mean()), "standardised_mse_all": float(std.mean()),
              "target_std": sd.tolist(),
              "note": "members in the order the official loader leaves them (sorted by the loss on data.pkl's "
                      "validation buffer); elites = the first K; best_k = the K lowest on these rows"}
    Path(out).write_text(json.dumps(result, indent=1))
    print(f"[holdout] {len(rows)} rows: raw MSE elites {result['raw_mse_elites']:.5g}, standardised MSE elites "
          f"{result['standardised_mse_elites']:.5g} (all members {result['standardised_mse_all']:.5g})")


if __name__ == "__main__":
    main()
