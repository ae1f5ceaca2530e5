"""experiments/wsrl_study: the pipeline end to end at a tiny budget on a tiny Hopper dataset (CQL, its evaluation
noise, WSRL, RLPD as CLI subprocesses; the summary; resume and skip commands; the deadline), and the claim checks on
synthetic curves where each claim can fail."""

import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import pytest

from tests.scripts import experiment_script, plain_iqm

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "wsrl_study" / "wsrl_study.py"
SMALL = "--actor-hidden 32 32 --critic-hidden 32 32 --num-critics 4"
TINY = ["--seeds", "0", "--pretrain-steps", "40", "--pretrain-eval-every", "20", "--online-steps", "200",
        "--eval-every", "100", "--eval-episodes", "2", f"--cql-args={SMALL} --batch-size 64 --threads 1",
        "--online-args=--batch-size 64 --learning-starts 100 --threads 1", f"--rlpd-args={SMALL}"]


@pytest.fixture(scope="module")
def summarize():
    with experiment_script("experiments/wsrl_study/summarize.py", "wsrl_study_summarize_test") as mod:
        yield mod


@pytest.fixture(scope="module")
def study():
    with experiment_script("experiments/wsrl_study/wsrl_study.py", "wsrl_study_test") as mod:
        yield mod


@pytest.fixture(scope="module")
def hopper_data(tmp_path_factory) -> str:
    """1,500 Hopper-v5 transitions of uniform random actions in the D4RL layout, episodes cut at 50 steps."""
    env = gym.make("Hopper-v5")
    rng = np.random.default_rng(0)
    rows: dict[str, list] = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals",
                                             "timeouts")}
    obs, _ = env.reset(seed=0)
    t = 0
    for _ in range(1500):
        a = rng.uniform(-1, 1, 3).astype(np.float32)
        nxt, r, term, trunc, _ = env.step(a)
        t += 1
        trunc = trunc or t == 50
        for k, v in zip(rows, (obs, a, r, nxt, term, trunc)):
            rows[k].append(v)
        obs = nxt
        if term or trunc:
            obs, _ = env.reset()
            t = 0
    path = tmp_path_factory.mktemp("data") / "hopper-tiny.hdf5"
    with h5py.File(path, "w") as f:
        for k, v in rows.items():
            arr = np.asarray(v)
            f[k] = arr if arr.dtype == np.bool_ else arr.astype(np.float32)
    return str(path)


def run_study(*args) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                       timeout=600, env={**os.environ, "MPLBACKEND": "Agg"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def test_pipeline_end_to_end_then_skips_resumes_and_respects_the_deadline(study, hopper_data, tmp_path, capsys):
    runs, out = tmp_path / "runs", tmp_path / "out"
    base = ["--dataset", hopper_data, "--runs-dir", str(runs), "--out-dir", str(out), *TINY]
    run_study(*base, "--jobs", "2")
    for d in ("cql-s0", "wsrl-s0", "rlpd-s0"):
        assert (runs / d / "checkpoints" / "latest.pt").is_file(), d
    noise = json.loads((runs / "evalnoise-s0.json").read_text())
    assert noise["episodes"] == 2 and noise["return_std"] >= 0 and "--seed 20000" in noise["command"]
    p = json.loads((out / "wsrl_study.json").read_text())
    assert (out / "wsrl_study.png").stat().st_size > 0 and "## Claims" in (out / "wsrl_study.md").read_text()
    wsrl, cql = p["runs"]["wsrl"]["0"], p["runs"]["cql"]["0"]
    assert wsrl["steps"] == [0, 100, 200] and wsrl["complete"] and cql["steps"] == [20, 40]
    assert wsrl["init"] == str(runs / "cql-s0") and wsrl["dataset"] is None and p["runs"]["rlpd"]["0"]["dataset"]
    assert wsrl["commit"] and p["run_commits"]
    # every run that read the dataset recorded its sha256 (cql and rlpd; wsrl reads none), and the summary says so
    sha = hashlib.sha256(Path(hopper_data).read_bytes()).hexdigest()
    assert p["data"] == {"sha256": [sha], "runs_recording": 2, "runs_with_dataset": 2}
    assert f"Data: sha256 {sha[:12]}, recorded by 2 of the 2 runs" in (out / "wsrl_study.md").read_text()
    claims = {c["claim"]: c for c in p["claims"]}
    # the pre-trained policy is unchanged at online step 0, and the WSRL run never loaded the dataset
    assert claims["score at online step 0 equals the pre-trained score"]["verdict"] == "held"
    assert abs(wsrl["scores"][0] - cql["scores"][-1]) < 1e-6
    assert claims["no offline data retained"]["verdict"] == "held"
    assert claims["WSRL at or above RLPD over the online phase"]["verdict"] == "not answerable"  # one seed
    # a second call: the complete runs are skipped; with a larger online budget the online runs resume
    study.main([*base, "--dry-run", "--online-steps", "300"])
    dry = capsys.readouterr().out
    assert "# complete: cql-s0" in dry and "# complete: evalnoise-s0" in dry
    resumed = [x for x in dry.splitlines() if "--resume" in x]
    assert len(resumed) == 2 and all("--total-steps 300" in x for x in resumed)
    assert any(f"train wsrl --resume {runs / 'wsrl-s0'}" in x for x in resumed)
    # the machine replaced: the runs dir is gone; the kept copies count as done and the summary reads them
    kept = out / "kept" / "wsrl_study"
    assert {"cql-s0", "wsrl-s0", "rlpd-s0", "evalnoise-s0.json.gz"} <= {x.name for x in kept.iterdir()}
    shutil.rmtree(runs)
    study.main([*base, "--dry-run"])
    dry = capsys.readouterr().out
    assert all(f"# complete: {n}" in dry for n in ("cql-s0", "rlpd-s0", "evalnoise-s0", "wsrl-s0")), dry
    runs.mkdir()
    (runs / "study.json").write_text(json.dumps(p["study"]))
    again = study.summarizer().summarize(runs, out)
    assert again["runs"]["wsrl"]["0"]["kept"] and again["runs"]["wsrl"]["0"]["scores"] == wsrl["scores"]
    assert json.loads(json.dumps([again["eval_noise"], again["claims"]])) == [p["eval_noise"], p["claims"]]
    # without WSRL's kept copy its run must start over, and so must the cql run it starts from
    shutil.rmtree(kept / "wsrl-s0")
    study.main([*base, "--dry-run"])
    dry = capsys.readouterr().out
    assert "# complete: rlpd-s0" in dry and "# complete: cql-s0" not in dry and "train cql --dataset" in dry
    # a stage the deadline cannot fit does not start, nor do the runs that wait for it
    late = tmp_path / "late"
    a = study.parse_args(["--dataset", hopper_data, "--runs-dir", str(late), *TINY, "--pretrain-rate", "0.01",
                          "--online-rate", "0.01"])
    deadline = study.parse_deadline("+1m", datetime.datetime.now().astimezone())
    jobs = study.study_jobs([0], late, 40, 200, retained=False)
    state = study.launch(jobs, a, hopper_data, late, study.Launcher(late, dry_run=False), deadline)
    printed = capsys.readouterr().out
    assert state == {"cql-s0": "deadline", "rlpd-s0": "deadline", "evalnoise-s0": "failed", "wsrl-s0": "failed"}
    assert "[deadline] cql-s0: not started" in printed and "[skip] wsrl-s0: cql-s0 did not complete" in printed
    assert "[start]" not in printed and not late.exists()


def test_deadline_parsing(study):
    now = datetime.datetime(2026, 11, 26, 6, 0, tzinfo=datetime.timezone.utc)
    assert study.parse_deadline("+2h", now) == now + datetime.timedelta(hours=2)
    assert study.parse_deadline("+90m", now) == now + datetime.timedelta(minutes=90)
    assert study.parse_deadline("2026-11-26T09:30+00:00", now) == now + datetime.timedelta(hours=3.5)
    assert study.parse_deadline(None, now) is None
    with pytest.raises(SystemExit, match="--deadline 'tomorrow'"):
        study.parse_deadline("tomorrow", now)


# ------------------------------------------------------------------------------------- the claim checks
def curve(steps, scores, complete=True, warmup=100, dataset=None, ratio=0.0, excess=0) -> dict:
    return {"steps": steps, "scores": scores, "complete": complete, "warmup": warmup, "dataset": dataset,
            "offline_ratio": ratio, "replay_excess": excess}


def scenario(changes: dict | None = None) -> dict:
    """Three seeds where every claim holds: WSRL starts at CQL's score, dips at most 5 points after its 100-step
    warm-up, and lies 10 points above RLPD. ``changes``: (method, seed) -> replacement run."""
    runs: dict = {"cql": {}, "wsrl": {}, "rlpd": {}}
    for s, base in enumerate((30.0, 40.0, 50.0)):
        runs["cql"][s] = curve([50, 100], [base - 5, base])
        runs["wsrl"][s] = curve([0, 100, 200, 300], [base, base, base - 5, base + 10])
        runs["rlpd"][s] = curve([0, 100, 200, 300], [0.0, 5.0, base - 15, base])
    for (m, s), r in (changes or {}).items():
        runs[m][s] = r
    return runs


@pytest.fixture
def fast_stats(summarize, monkeypatch):
    """Plain stand-ins for rliable's bootstraps (seconds each) where the test is not about claim 3: the mean with
    the range, and the exact probability of improvement as its own interval."""
    def plain_improvement(pairs):
        (x, y), = pairs.values()
        p = float(np.mean([[1.0 if a[0] > b[0] else 0.5 if a[0] == b[0] else 0.0 for b in y] for a in x]))
        return {k: {"p": p, "ci95": [p, p]} for k in pairs}

    monkeypatch.setattr(summarize, "iqm_ci", plain_iqm)
    monkeypatch.setattr(summarize, "improvement_ci", plain_improvement)


def verdicts(summarize, runs, noise=None) -> list[str]:
    noise = noise if noise is not None else {0: 0.5, 1: 0.5, 2: 0.5}
    return [c["verdict"] for c in summarize.check_claims(runs, noise)]


def test_claims_hold_on_a_clean_scenario(summarize, monkeypatch):
    monkeypatch.setattr(summarize, "iqm_ci", plain_iqm)  # the IQMs are only reported; P(WSRL > RLPD) is rliable's
    claims = summarize.check_claims(scenario(), {0: 0.5, 1: 0.5, 2: 0.5})
    assert [c["verdict"] for c in claims] == ["held"] * 4
    c3 = claims[2]
    assert c3["probability_of_improvement"]["p"] == 1.0 and c3["per_seed"][0]["wsrl"] > c3["per_seed"][0]["rlpd"]
    assert claims[1]["per_seed"][0]["drop"] == pytest.approx(5.0)


def test_claim_1_step_zero_against_the_evaluation_noise(summarize, fast_stats):
    off = scenario({("wsrl", 1): curve([0, 100, 200, 300], [41.5, 40.0, 35.0, 50.0])})  # 1.5 above CQL's 40
    assert verdicts(summarize, off)[0] == "not held"  # tolerance 2 x 0.5
    assert verdicts(summarize, off, {0: 1.0, 1: 1.0, 2: 1.0})[0] == "held"  # tolerance 2 x 1.0
    assert verdicts(summarize, off, {})[0] == "not held"  # no noise estimate: 0.5 points
    # no complete CQL run: nothing to compare with
    gone = scenario({("cql", s): curve([50], [1.0], complete=False) for s in range(3)})
    assert verdicts(summarize, gone)[0] == "not answerable"


def test_claim_2_drop_after_the_warm_up(summarize, fast_stats):
    deep = scenario({("wsrl", 2): curve([0, 100, 200, 300], [50.0, 50.0, 39.5, 60.0])})  # 10.5 below step 0
    assert verdicts(summarize, deep)[1] == "not held"
    edge = scenario({("wsrl", 2): curve([0, 100, 200, 300], [50.0, 50.0, 40.0, 60.0])})  # exactly 10
    assert verdicts(summarize, edge)[1] == "held"
    # a low evaluation at the warm-up's last step is not after it
    warm = scenario({("wsrl", 2): curve([0, 100, 200, 300], [50.0, 20.0, 45.0, 60.0])})
    assert verdicts(summarize, warm)[1] == "held"


def test_claim_3_wsrl_against_rlpd(summarize, monkeypatch):
    monkeypatch.setattr(summarize, "iqm_ci", plain_iqm)  # the IQMs are only reported; P(WSRL > RLPD) is rliable's
    below = scenario({("rlpd", s): curve([0, 100, 200, 300], [90.0] * 4) for s in range(3)})
    assert verdicts(summarize, below)[2] == "not held"
    mixed = scenario({("rlpd", 0): curve([0, 100, 200, 300], [90.0] * 4)})  # one seed of three above WSRL
    assert verdicts(summarize, mixed)[2] == "not separated"
    # an incomplete RLPD run leaves its seed out; two seeds are reported, not judged
    short = scenario({("rlpd", 2): curve([0, 100], [0.0, 5.0], complete=False)})
    claim = summarize.check_claims(short, {0: 0.5, 1: 0.5, 2: 0.5})[2]
    assert claim["verdict"] == "not answerable" and sorted(claim["per_seed"]) == [0, 1]
    assert "fewer than 3: not judged" in claim["detail"]


def test_claim_4_offline_data(summarize, fast_stats):
    steps, scores = [0, 100, 200, 300], [30.0, 30.0, 25.0, 40.0]
    for bad in (curve(steps, scores, dataset="hopper-medium-replay-v5"), curve(steps, scores, ratio=0.5),
                curve(steps, scores, excess=1000)):
        assert verdicts(summarize, scenario({("wsrl", 0): bad}))[3] == "not held"


def test_mean_over_run_is_the_area_over_the_span(summarize):
    assert summarize.mean_over_run([0, 100, 300], [0.0, 10.0, 10.0]) == pytest.approx((500 + 2000) / 300)
    assert summarize.mean_over_run([0], [5.0]) is None


def test_run_rate_counts_only_steps_after_the_warm_up(study, tmp_path):
    d = tmp_path / "wsrl-s0"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"run": {"loop": {"learning_starts": 5000}}}))
    rows = [(0, 0.0), (5000, 10.0), (6000, 210.0), (7000, 410.0)]  # the warm-up is fast, then 5 steps/s
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "wall_time": t}) + "\n" for s, t in rows))
    assert study.run_rate(d) == pytest.approx(5.0)
    # a resumed leg whose clock restarted: its own rows only (2 steps/s)
    with open(d / "metrics.jsonl", "a") as f:
        f.write("".join(json.dumps({"step": s, "wall_time": t}) + "\n" for s, t in ((7500, 50.0), (8500, 550.0))))
    assert study.run_rate(d) == pytest.approx(2.0)
    (d / "metrics.jsonl").write_text(json.dumps({"step": 5000, "wall_time": 10.0}) + "\n")
    assert study.run_rate(d) is None  # nothing after the warm-up yet: the deadline falls back to --online-rate
