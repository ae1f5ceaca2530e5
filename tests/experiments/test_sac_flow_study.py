"""experiments/sac_flow: the study end to end at a tiny budget (SAC and Flow-G as CLI subprocesses, two at a time, the
summary), the skip and resume commands, the deadline, SIGTERM stopping the runs, and the claim on synthetic results
where it can hold, fail, not separate, or not be answerable."""

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.scripts import experiment_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "sac_flow" / "sac_flow_study.py"
TINY = ["--seeds", "0", "--steps", "200", "--eval-every", "100", "--eval-episodes", "2", "--no-compile",
        "--run-args=--learning-starts 100 --batch-size 32 --actor-hidden 32 32 --critic-hidden 32 32 --log-every 50",
        "--flow-args=--flow-hidden 32 --noise-hidden 32 --flow-steps 2"]


@pytest.fixture(scope="module")
def study():
    with experiment_script("experiments/sac_flow/sac_flow_study.py", "sac_flow_study_test") as mod:
        yield mod


@pytest.fixture(scope="module")
def summarize():
    with experiment_script("experiments/sac_flow/summarize.py", "sac_flow_study_summarize_test") as mod:
        yield mod


def test_pipeline_end_to_end_then_skips_and_resumes(study, summarize, tmp_path, capsys):
    runs, out = tmp_path / "runs", tmp_path / "out"
    base = ["--runs-dir", str(runs), "--out-dir", str(out), "--variants", "sac", "flow-g", *TINY]
    r = subprocess.run([sys.executable, str(SCRIPT), *base, "--jobs", "2"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300, env={**os.environ, "MPLBACKEND": "Agg"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "[study] 2 of 2 runs done" in r.stdout
    for v in ("sac", "flow-g"):
        assert (runs / f"hopper-{v}-s0" / "checkpoints" / "latest.pt").is_file()
    cfg = json.loads((runs / "hopper-flow-g-s0" / "config.json").read_text())
    assert cfg["config"]["velocity"] == "gated" and cfg["config"]["flow_steps"] == 2 and not cfg["config"]["compile"]
    assert cfg["run"]["eval_every"] == 100 and cfg["run"]["loop"]["save_replay"]
    p = json.loads((out / "sac_flow_study.json").read_text())
    assert (out / "sac_flow_study.png").stat().st_size > 0
    assert "## Claim" in (out / "sac_flow_study.md").read_text()
    run_final = {}
    for v in ("sac", "flow-g"):
        run = p["runs"][v]["0"]
        run_final[v] = run["final_return"]
        assert not run["kept"]
        assert run["steps"] == [0, 100, 200] and run["complete"] and run["commit"]
        assert run["final_return"] == pytest.approx(run["returns"][-1])  # the last 10% of 200 steps: step 200 alone
        assert run["train_steps"] and run["auc"] is not None
    assert p["run_commits"] and p["study"]["variants"] == ["sac", "flow-g"]
    assert p["claim"]["verdict"] == "not answerable"  # one seed
    assert p["probability_of_improvement"]["final_return"]["flow-g>sac"]["seeds"] == [0]
    # a second call skips the complete runs; a larger budget resumes them (the run's own settings)
    study.main([*base, "--dry-run"])
    assert capsys.readouterr().out.splitlines() == ["# complete: hopper-flow-g-s0", "# complete: hopper-sac-s0"]
    study.main([*base, "--dry-run", "--steps", "300", "--variants", "flow-t", "flow-g"])
    lines = capsys.readouterr().out.splitlines()
    assert "--velocity decoded" in lines[0] and "--resume" not in lines[0]  # flow-t first: the longest
    assert f"train sac_flow --resume {runs / 'hopper-flow-g-s0'} --total-steps 300" in lines[1]
    assert "--velocity" not in lines[1] and "--flow-hidden" not in lines[1]
    # a second invocation for part of the study (here refused by its deadline) widens study.json, never narrows it
    study.main([*base, "--variants", "flow-t", "--seeds", "1", "--rate-scale", "1e-4", "--deadline", "+1m"])
    rec = json.loads((runs / "study.json").read_text())
    assert rec["variants"] == ["sac", "flow-g", "flow-t"] and rec["seeds"] == [0, 1] and len(rec["invocations"]) == 2
    assert set(rec["commands"]) == {"sac", "flow-g", "flow-t"}
    assert "[start]" not in capsys.readouterr().out  # nothing launched
    # the machine replaced: the run directories are gone; the kept copies count as done and the summary reads them
    assert {p.name for p in (out / "kept" / "hopper-sac-s0").iterdir()} == {"config.json.gz", "metrics.jsonl.gz"}
    kept = (out / "kept" / "hopper-sac-s0" / "metrics.jsonl.gz").read_bytes()
    shutil.rmtree(runs)
    study.main([*base, "--dry-run"])
    assert capsys.readouterr().out.splitlines() == ["# complete: hopper-flow-g-s0", "# complete: hopper-sac-s0"]
    runs.mkdir()
    (runs / "study.json").write_text(json.dumps(p["study"]))
    again = summarize.summarize(runs, out)
    for v in ("sac", "flow-g"):
        assert again["runs"][v]["0"]["kept"] and again["runs"][v]["0"]["final_return"] == run_final[v]
        assert again["runs"][v]["0"]["commit"] == p["runs"][v]["0"]["commit"]
    assert (out / "kept" / "hopper-sac-s0" / "metrics.jsonl.gz").read_bytes() == kept  # not rewritten


def test_deadline_starts_nothing_that_cannot_finish(study, tmp_path, capsys):
    a = study.parse_args(["--runs-dir", str(tmp_path), "--out-dir", str(tmp_path / "out"), *TINY,  # nothing kept
                          "--rate-scale", "1e-4"])  # SAC 0.003 env steps/s
    deadline = study.parse_deadline("+10m", datetime.datetime.now().astimezone())
    jobs = study.study_jobs("hopper", ["sac", "flow-t"], [0], tmp_path)
    assert study.launch(jobs, a, tmp_path, deadline) == {"hopper-flow-t-s0": "deadline", "hopper-sac-s0": "deadline"}
    assert "[start]" not in capsys.readouterr().out and not (tmp_path / "commands.txt").exists()
    # the estimate: steps left at the variant's rate, start-up, and the compile for a flow
    a = study.parse_args(["--steps", "1000"])
    sac, flow_t = (study.estimate_s(study.Job(v, 0, tmp_path / v), tmp_path, a) for v in ("sac", "flow-t"))
    assert sac == pytest.approx(1000 / study.VARIANTS["sac"].rate + study.START_S)
    assert flow_t == pytest.approx(1000 / study.VARIANTS["flow-t"].rate + study.START_S + study.COMPILE_S)


def test_deadline_parsing(study):
    now = datetime.datetime(2026, 11, 26, 6, 0, tzinfo=datetime.timezone.utc)
    assert study.parse_deadline("+2h", now) == now + datetime.timedelta(hours=2)
    assert study.parse_deadline("2026-11-26T09:30+00:00", now) == now + datetime.timedelta(hours=3.5)
    with pytest.raises(SystemExit, match="--deadline 'tomorrow'"):
        study.parse_deadline("tomorrow", now)


def test_sigterm_stops_the_running_runs(study, tmp_path, monkeypatch, capsys):
    """The launch loop with stand-in runs (sleeping processes): SIGTERM to the study stops both and raises Stop."""
    monkeypatch.setattr(study, "command", lambda job, a: [sys.executable, "-c", "import time; time.sleep(60)"])
    a = study.parse_args(["--runs-dir", str(tmp_path), "--out-dir", str(tmp_path / "out"), *TINY, "--jobs", "2",
                          "--poll", "0.05"])
    jobs = study.study_jobs("hopper", ["sac", "flow-g", "flow-t"], [0], tmp_path)
    previous = signal.signal(signal.SIGTERM, study._on_sigterm)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        timer.start()
        with pytest.raises(study.Stop):
            study.launch(jobs, a, tmp_path, None)
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
        study._STOP["signal"] = None
    printed = capsys.readouterr().out
    # the first two started, both were stopped by SIGTERM (exit -15), the third never started
    assert printed.count("[start]") == 2 and printed.count(f"exit {-signal.SIGTERM}; resumes") == 2
    assert "hopper-sac-s0" not in printed


# ------------------------------------------------------------------------------------- the claim
def result(final: float, complete: bool = True) -> dict:
    return {"final_return": final if complete else None, "auc": final / 2 if complete else None}


def scenario(sac, flow_g, flow_t) -> dict:
    """Per variant the seeds' final returns (None: an incomplete run)."""
    return {v: {s: result(x or 0.0, x is not None) for s, x in enumerate(xs)}
            for v, xs in (("sac", sac), ("flow-g", flow_g), ("flow-t", flow_t))}


def test_claim_on_synthetic_results(summarize, monkeypatch):
    """rliable's probability of improvement with its bootstrap CI, judged as the README says (each distinct pair of
    samples bootstrapped once: a second or two each)."""
    real, cache = summarize.improvement_ci, {}

    def once(pairs):
        key = json.dumps(pairs)
        if key not in cache:
            cache[key] = real(pairs)
        return cache[key]

    monkeypatch.setattr(summarize, "improvement_ci", once)
    sac = [1000, 1200, 1400]

    def claim(g, t):
        c = summarize.check_claim(scenario(sac, g, t))
        return c["verdict"], c["per_flow"]["flow-g"]["verdict"], c["per_flow"]["flow-t"]["verdict"]

    above, below, mixed = [2000, 2100, 2200], [500, 600, 700], [900, 1300, 1500]
    assert claim(above, above) == ("held", "held", "held")
    assert claim(above, below) == ("not held", "held", "not held")  # one flow below SAC on every seed
    assert claim(above, mixed) == ("not separated", "held", "not separated")  # P(Flow-T > SAC) = 5/9
    assert claim(below, mixed) == ("not held", "not held", "not separated")
    # an incomplete run leaves its seed out: two seeds are reported, not judged
    c = summarize.check_claim(scenario(sac, above, [2000, 2100, None]))
    assert c["verdict"] == "not answerable" and c["per_flow"]["flow-t"]["seeds"] == 2
    assert c["per_flow"]["flow-t"]["p"] == 1.0
    # mixed: the point estimate is the exact Mann-Whitney fraction, its CI contains 0.5
    t = summarize.check_claim(scenario(sac, above, mixed))["per_flow"]["flow-t"]
    assert t["p"] == pytest.approx(5 / 9) and t["ci95"][0] < 0.5 < t["ci95"][1]


def test_read_run_final_return_auc_and_budget(summarize, tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    rows = [{"step": s, "wall_time": s / 10, "eval_return": y} for s, y in ((0, 0.0), (50, 100.0), (90, 200.0))]
    rows += [{"step": 95, "wall_time": 9.5, "iteration": 95, "episode_return": 7.0},
             {"step": 100, "wall_time": 10.0, "eval_return": 400.0}, {"step": 110, "eval_return": 9e9}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = summarize.read_run(d, budget=100)
    assert r["steps"] == [0, 50, 90, 100] and r["complete"]  # step 110 lies beyond the budget
    assert r["final_return"] == pytest.approx(300.0)  # evaluations at 90 and 100: the last 10% of 100 steps
    assert r["auc"] == pytest.approx((50 * 50 + 40 * 150 + 10 * 300) / 100)
    assert r["train_steps"] == [95] and r["train_returns"] == [7.0]
    short = summarize.read_run(d, budget=200)
    assert not short["complete"] and short["final_return"] is None and short["auc"] is None


def test_curve_band_over_the_steps_every_seed_evaluated(summarize):
    band = summarize.curve_band({0: {"steps": [0, 10, 20], "returns": [1.0, 2.0, 3.0]},
                                 1: {"steps": [0, 10], "returns": [3.0, 4.0]}})
    assert band["steps"] == [0, 10] and band["seeds"] == 2  # the steps every seed evaluated
    assert band["iqm"][0] == pytest.approx(2.0) and band["lo"][0] <= 2.0 <= band["hi"][0]
