"""experiments/edge_of_reach/seeds.py without training: fabricated MBPO and RAVL runs over two seeds, the first step
above the value bound, the pairwise probability, the reading and the report (rliable is the bench extra's: the
aggregate is stubbed with the plain mean)."""

import json
from pathlib import Path

import pytest

from tests.scripts import experiment_script, plain_iqm

SCALES = {"q_bound": 600.0, "mc_return_mean": 250.0, "gamma": 0.99, "episode_return_mean": 1000.0}


@pytest.fixture(scope="module")
def seeds():
    with experiment_script("experiments/edge_of_reach/seeds.py", "eor_seeds") as mod:
        yield mod


def fake_run(d: Path, q: list[float], returns: list[float], total_steps: int | None = None) -> None:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"code": {"started": {"git": "abc1234"}},
                                               "run": {"total_steps": total_steps or 500 * len(q)}}))
    rows = [{"step": 500 * (i + 1), "stats/q_mean": v, "stats/q_max": 1.5 * v, "updates_per_s": 10.0}
            for i, v in enumerate(q)]
    for i, r in enumerate(returns):
        rows[i]["episode_return"] = r
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_blow_up_steps_truth_ratios_reading_and_report(seeds, tmp_path, monkeypatch):
    fake_run(tmp_path / "mbpo-s0", [100, 300, 500, 550], [50, 60])
    fake_run(tmp_path / "mbpo-s1", [100, 400, 700, 900], [40, 30])  # passes the bound at its 3rd log (step 1500)
    fake_run(tmp_path / "ravl-s0", [80, 120, 150, 160], [90, 100])
    fake_run(tmp_path / "ravl-s1", [70, 110, 140, 150], [80, 110])
    runs = seeds.collect(tmp_path, [0, 1, 2], None, SCALES, 10, 20)  # seed 2 has no runs: skipped
    assert set(runs) == {"mbpo", "ravl"} and set(runs["mbpo"]) == {"0", "1"}
    assert runs["mbpo"]["1"]["first_step_above_bound"] == 1500
    assert runs["mbpo"]["0"]["first_step_above_bound"] is None
    assert runs["ravl"]["0"]["q_mean_last"] == 160 and runs["ravl"]["0"]["q_max_largest"] == 240
    for algo, ratios in (("mbpo", (4.0, 6.0)), ("ravl", (1.5, 1.2))):  # what q_truth would have measured
        for seed, ratio in zip(("0", "1"), ratios):
            runs[algo][seed]["truth"] = {"ratio_mean": ratio, "corr_q_mc": 0.3}
    monkeypatch.setattr(seeds, "iqm_ci", plain_iqm)
    agg = seeds.aggregate(runs)
    assert agg["q_over_g"]["mbpo"]["iqm"] == pytest.approx(5.0)
    assert agg["p_ravl_ratio_below_mbpo"] == 1.0
    text = seeds.reading(runs, agg, SCALES)
    assert "mbpo: q_mean passes r_max/(1-gamma) = 600 in 1 of 2 seeds (seed 1 at step 1,500)" in text
    assert "ravl: q_mean stays below" in text and "P(RAVL's Q/G < MBPO's) over seed pairs: 1.00" in text
    payload = {"command": "x", "date": "d", "commits": "abc1234", "dataset": "hopper-medium-v5", "seeds": [0, 1],
               "budget": {"steps": [2000], "paper_steps": 3_000_000}, "truth_settings": {"states": 10, "horizon": 20},
               "value_scales": SCALES, "runs": runs, "aggregate": agg, "reading": text}
    md = seeds.markdown(payload)
    assert "| mbpo | 1 | 2,000 | 1,500 |" in md and "| Q / G | 5 [4, 6] | 1.35 [1.2, 1.5] |" in md
    seeds.plot(payload, tmp_path / "seeds.png")
    assert (tmp_path / "seeds.png").stat().st_size > 10_000


def test_p_below_counts_ties_half(seeds):
    assert seeds.p_below([1.0, 2.0], [2.0, 3.0]) == pytest.approx((1 + 1 + 0.5 + 1) / 4)


def test_records_of_an_earlier_summary_stand_in_for_missing_runs(seeds, tmp_path):
    fake_run(tmp_path / "runs" / "mbpo-s0", [100, 300], [50])
    fake_run(tmp_path / "runs" / "ravl-s0", [80, 120], [90])
    fake_run(tmp_path / "runs" / "mbpo-s1", [100], [40], total_steps=5000)  # still running
    first = seeds.collect(tmp_path / "runs", [0, 1], None, SCALES, 10, 20)
    assert first["mbpo"]["0"]["commit"] == "abc1234" and first["mbpo"]["0"]["finished"]
    assert not first["mbpo"]["1"]["finished"]
    earlier = tmp_path / "seeds.json"
    earlier.write_text(json.dumps({"date": "2026-11-26", "truth_settings": {"states": 10, "horizon": 20},
                                   "runs": first}))
    for lost in ("ravl-s0", "mbpo-s1"):  # the machine lost these runs
        (tmp_path / "runs" / lost / "metrics.jsonl").unlink()
    fake_run(tmp_path / "runs" / "ravl-s1", [70, 90], [80])
    again = seeds.collect(tmp_path / "runs", [0, 1], None, SCALES, 10, 20, seeds.carried(earlier, 10, 20))
    assert again["ravl"]["0"]["q_mean_last"] == 120 and again["ravl"]["0"]["carried_from"] == "seeds.json of 2026-11-26"
    assert "carried_from" not in again["ravl"]["1"] and "carried_from" not in again["mbpo"]["0"]
    assert "1" not in again["mbpo"]  # an unfinished run is not carried: it runs again
    assert seeds.carried(earlier, 200, 500) == {}  # other truth settings: nothing carried
    assert seeds.carried(tmp_path / "missing.json", 10, 20) == {}
