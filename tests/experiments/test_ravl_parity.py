"""experiments/ravl_parity/compare.py on fabricated runs: the official results.json files and ctrl_rl run
directories read into scores at one step, Welch's test, speeds and the fits' holdout MSE; a missing checkout says
how to get it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import ROOT, experiment_script, local_references


@pytest.fixture(scope="module")
def cmp():
    with experiment_script("experiments/ravl_parity/compare.py", "ravl_parity_compare") as mod:
        yield mod


def official_agent(d: Path, seed: int, scores: dict[int, float], rate: float) -> Path:
    d.mkdir(parents=True)
    evals = [{"step": s, "normalized_mean": v, "return_mean": 0.0} for s, v in scores.items()]
    (d / "results.json").write_text(json.dumps({"stage": "agent", "seed": seed, "evals": evals, "commit": "18b5085",
                                                "checkout_modified": False, "grad_steps_per_s": rate}))
    return d


def ctrl_rl_agent(d: Path, returns: dict[int, float], rate: float) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"code": {"started": {"git": "abc1234"}}}))
    rows = [{"step": s, "wall_time": s / rate, "updates_per_s": rate, "episode_return": r} for s, r in returns.items()]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_scores_at_one_step_welch_speed_and_fits(cmp, tmp_path, monkeypatch):
    from ctrl_rl.storage.datasets.scores import normalized_score

    local_references(monkeypatch, tmp_path / "refs.json", {"halfcheetah": (-300.0, 10000.0)})

    ours = tmp_path / "ctrl"
    for s, ret in enumerate((3000.0, 3100.0, 2900.0)):
        ctrl_rl_agent(ours / f"ravl-s{s}", {10000: 2000.0, 20000: ret}, rate=24.0)
    runs = [cmp.ctrl_rl_agent(ours / f"ravl-s{s}", "HalfCheetah-v5") for s in range(3)]
    assert [r["seed"] for r in runs] == [0, 1, 2] and runs[0]["grad_steps_per_s"] == 24.0
    assert cmp.at_step(runs[1], 20000) == pytest.approx(float(normalized_score("HalfCheetah-v5", 3100.0, "local")[0]))
    assert cmp.at_step(runs[1], 20000) == pytest.approx(100 * 3400 / 10300)
    assert cmp.at_step(runs[1], 15000) is None
    off = [cmp.official_agent(official_agent(tmp_path / f"off{s}", s, {20000: 35.0 + s}, 9.0)) for s in range(3)]
    w = cmp.welch([cmp.at_step(r, 20000) for r in runs], [cmp.at_step(r, 20000) for r in off])
    assert w["mean_official"] == pytest.approx(36.0) and 0 <= w["p"] <= 1
    fit = tmp_path / "off_fit"
    fit.mkdir()
    (fit / "results.json").write_text(json.dumps({
        "holdout": {"rows": 10, "standardised_mse_elites": 0.004, "raw_mse_elites": 0.9, "standardised_mse": [0.004]},
        "fit": {"epochs": [{"epoch": 0}, {"epoch": 1}, {"epoch": 2}]}, "wall_seconds": 100.0, "torch_threads": 2}))
    (ours / "dynamics").mkdir()
    (ours / "dynamics" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": e, "holdout_mse_best": 0.01 / e}) + "\n" for e in (1, 2, 3)))
    f = cmp.fits([fit], ours / "dynamics")
    (eq,) = f["equal_epochs"]  # the official fit's 2 epochs beside ctrl_rl's epoch 2 (epoch 0: before training)
    assert eq["epochs"] == 2 and eq["ctrl_rl"]["standardised_mse_elites"] == 0.005
    assert eq["official"]["standardised_mse_elites"] == 0.004 and f["ctrl_rl_final"]["epochs"] == 3
    model = tmp_path / "conv" / "dynamics" / "model_x"
    model.mkdir(parents=True)
    (tmp_path / "conv" / "convert.json").write_text("{}")
    assert cmp.agents_model([{"model": str(model)}]) == "ctrl_rl's fit (convert.py)"
    assert cmp.agents_model([{"model": str(tmp_path / "fit" / "dynamics" / "model_y")}]) == "an official fit"


def test_a_missing_checkout_says_how_to_get_it(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "experiments/ravl_parity/compare.py"), "--checkout",
                        str(tmp_path / "nowhere"), "--official-fit", "x", "--official-agents", "y", "--ctrl-rl", "z"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "git clone https://github.com/anyasims/edge-of-reach" in r.stderr
