"""experiments/domo_minatar/domo_minatar.py: the commands it runs (shared settings, each variant's own flags, resume,
skip) and its summary on fabricated run directories (final score over the last 10% of the frames, normalized by random
play and the best run, the comparison restricted to cells every variant finished, the commits the runs recorded).
rliable is the bench extra's: its two calls are replaced by plain stand-ins."""

import json

import pytest

from tests.scripts import experiment_script, plain_iqm

SCRIPT = "experiments/domo_minatar/domo_minatar.py"
GAMES = ["Breakout", "Asterix"]
RANDOM = {"Breakout": 0.5, "Asterix": 1.0}
FRAMES = 64_000  # 100 updates of 640 frames; rows every 6,400


def plain_iqm_tasks(values):
    """``iqm_ci`` for ``[seeds][games]`` lists: the plain mean over every cell."""
    return plain_iqm({k: [x for row in v for x in row] for k, v in values.items()})


def plain_improvement(pairs):
    """``improvement_ci`` without rliable: per game the fraction of run pairs where X beats Y (ties half), averaged."""
    out = {}
    for k, (x, y) in pairs.items():
        per_game = []
        for j in range(len(x[0])):
            xs, ys = [r[j] for r in x], [r[j] for r in y]
            wins = sum((a > b) + 0.5 * (a == b) for a in xs for b in ys)
            per_game.append(wins / (len(xs) * len(ys)))
        p = sum(per_game) / len(per_game)
        out[k] = {"p": p, "ci95": [p, p]}
    return out


@pytest.fixture
def mod(monkeypatch):
    with experiment_script(SCRIPT, "domo_minatar") as m:
        monkeypatch.setattr(m, "iqm_ci", plain_iqm_tasks)
        monkeypatch.setattr(m, "improvement_ci", plain_improvement)
        yield m


def level(variant: str, game: str, seed: int) -> float:
    """The return a fabricated run logs at the end: variants ordered, games apart, seeds a little apart."""
    return {"impala": 2.0, "impala-lam0.95": 3.0, "domo-k0.5": 4.0, "domo-k0.9": 6.0}[variant] \
        * (1 if game == "Breakout" else 10) + 0.1 * seed


def fabricate(runs, game, variant, seed, frames=FRAMES, commit="abc1234"):
    """A run directory as the CLI leaves it: metrics rows every 10 updates (the last at the final update), config.json
    with the commit it started from. The return climbs linearly to ``level`` at 80% of the frames, then stays."""
    d = runs / game / f"{variant}-s{seed}"
    d.mkdir(parents=True)
    steps = list(range(6400, frames + 1, 6400))
    if steps[-1] != frames:
        steps.append(frames)
    top = level(variant, game, seed)
    rows = [{"step": s, "wall_time": s / 5000, "update": s // 640, "episode_return": top * min(1.0, s / (0.8 * FRAMES)),
             "episodes": 20, "sps": 5000.0, "actors/lag_mean": 2.0, "stats/rho_clipped": 0.5} for s in steps]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "config.json").write_text(json.dumps({"algo": "impala", "code": {"started": {"git": commit}}}))
    return d


def args(mod, tmp_path, *extra):
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    (runs / "random_scores.json").write_text(json.dumps({g: {"return": r, "std": 1.0, "episodes": 50, "steps": 1000}
                                                         for g, r in RANDOM.items()}))
    return mod.parse_args(["--games", *GAMES, "--frames", str(FRAMES), "--runs-dir", str(runs),
                           "--results-dir", str(tmp_path / "out"), *extra])


def test_final_score_is_the_episode_weighted_mean_of_the_last_tenth(mod):
    rows = [{"step": 80, "episode_return": 100.0, "episodes": 1},  # before the last 10% of 100 frames
            {"step": 95, "episode_return": 1.0, "episodes": 3},
            {"step": 98, "episode_return": None, "episodes": 0},  # no episode ended in this window
            {"step": 102, "episode_return": 5.0, "episodes": 1},  # the run's last update, a little past its budget
            {"step": 200, "episode_return": 50.0, "episodes": 1}]  # the run continued later: not compared
    assert mod.final_score(rows, 100) == pytest.approx((3 * 1.0 + 5.0) / 4)
    assert mod.final_score(rows[:1], 100) is None


def test_commands_share_every_setting_but_the_variants_own(mod, tmp_path):
    cmds = {v: mod.train_command(tmp_path / v, "Breakout", v, 1, FRAMES) for v in mod.VARIANTS}
    for v, cmd in cmds.items():
        algo, own = mod.VARIANTS[v]
        assert cmd[3:5] == ["train", algo] and cmd[-len(own) - len(mod.SHARED):len(cmd) - len(own)] == list(mod.SHARED)
        assert ["--env", "minatar:Breakout", "--seed", "1"] == cmd[8:12] and "--total-steps" in cmd
    assert cmds["impala"][-len(mod.SHARED):] == list(mod.SHARED)  # IMPALA's defaults: no flags of its own
    assert cmds["impala-lam0.95"][-2:] == ["--lambda", "0.95"] and cmds["domo-k0.9"][-2:] == ["--kappa", "0.9"]
    shared = " ".join(mod.SHARED)
    assert "--cnn-channels 16 --cnn-layers 1 --cnn-stride 1 --image-features 128" in shared  # MinAtar's network
    assert "--actors 2 --backend process" in shared
    (tmp_path / "impala/checkpoints").mkdir(parents=True)
    (tmp_path / "impala/checkpoints/latest.pt").write_bytes(b"")
    resumed = mod.train_command(tmp_path / "impala", "Breakout", "impala", 1, 2 * FRAMES)
    assert resumed[-2:] == ["--resume", str(tmp_path / "impala")] and str(2 * FRAMES) in resumed
    assert "--env" not in resumed  # a resume takes its settings from the run's config.json


def test_finished_runs_are_skipped_and_dry_run_prints_the_rest(mod, tmp_path, monkeypatch, capsys):
    a = args(mod, tmp_path, "--seeds", "0", "--games", "Breakout")
    monkeypatch.setattr(mod, "checkpoint_step", lambda d: FRAMES if d.name.startswith("impala") else 0)
    started = []
    monkeypatch.setattr(mod.subprocess, "Popen", lambda *x, **k: started.append(x) or pytest.fail("no run starts"))
    a.dry_run = True
    mod.run(a)
    assert capsys.readouterr().out.count("$ ") == 4  # a dry run lists every command
    a.dry_run, a.time_limit = False, 1e-9  # past the deadline: the unfinished runs are printed, none started
    mod.run(a)
    out = capsys.readouterr().out
    assert out.count("$ ") == 2 and "domo_ac" in out and "impala" not in out.replace("domo_ac", "")
    assert not started


def test_summary_normalizes_by_random_and_the_best_run(mod, tmp_path):
    a = args(mod, tmp_path)
    for g in GAMES:
        for v in mod.VARIANTS:
            for s in (0, 1, 2):
                fabricate(a.runs_dir, g, v, s)
    p = mod.summarize(a)
    assert p["games"] == GAMES and p["seeds"] == [0, 1, 2] and p["not_compared"] == {}
    assert p["commit"] == "abc1234" and p["frames"] == FRAMES and p["paper_frames"] == 5_000_000
    for g in GAMES:
        best = level("domo-k0.9", g, 2)
        assert p["per_game"][g]["best"] == pytest.approx(best)
        for v in mod.VARIANTS:
            for s in (0, 1, 2):
                run = p["per_game"][g]["variants"][v][str(s)]
                assert run["final"] == pytest.approx(level(v, g, s))  # flat over the last 10%
                assert run["normalized"] == pytest.approx((level(v, g, s) - RANDOM[g]) / (best - RANDOM[g]))
                assert run["curve"][-1] == [FRAMES, pytest.approx(level(v, g, s))] and len(run["curve"]) == 10
    assert p["per_game"]["Asterix"]["variants"]["domo-k0.9"]["2"]["normalized"] == pytest.approx(1.0)
    agg = p["aggregate"]
    assert agg["impala"]["iqm"] < agg["impala-lam0.95"]["iqm"] < agg["domo-k0.5"]["iqm"] < agg["domo-k0.9"]["iqm"]
    poi = p["probability_of_improvement"]
    assert set(poi) == {"impala-lam0.95 > impala", "domo-k0.5 > impala", "domo-k0.9 > impala",
                        "domo-k0.5 > impala-lam0.95", "domo-k0.9 > impala-lam0.95"}
    assert all(x["p"] == 1.0 for x in poi.values())  # every fabricated run of X beats every run of Y
    saved = json.loads((tmp_path / "out/domo_minatar.json").read_text())
    assert saved["per_game"]["Breakout"]["variants"]["impala"]["0"]["curve"][0] == [6400, pytest.approx(0.25)]
    md = (tmp_path / "out/domo_minatar.md").read_text()
    assert "| Breakout | 0.50 | domo-k0.9 | 6.00, 6.10, 6.20 | 6.10 |" in md and "Code: abc1234." in md
    assert (tmp_path / "out/domo_minatar.png").stat().st_size > 1000


def test_a_game_no_variant_learned_is_left_out_of_the_aggregate(mod, tmp_path):
    a = args(mod, tmp_path)
    # on Asterix every run ends within 0.2 of random play's 1.0 (std 1.0): below LEARNED_D = 0.5 of a std. The last
    # row is the only one in the final 10% of the frames, so it is the run's final score.
    for g in GAMES:
        for v in mod.VARIANTS:
            for s in (0, 1, 2):
                d = fabricate(a.runs_dir, g, v, s)
                if g == "Asterix":
                    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
                    rows[-1]["episode_return"] = 1.0 + 0.1 * s
                    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = mod.summarize(a)
    assert p["games"] == GAMES and p["aggregated_games"] == ["Breakout"] and p["not_learned"] == ["Asterix"]
    assert p["per_game"]["Asterix"]["learned"] is False and p["per_game"]["Breakout"]["learned"] is True
    assert p["per_game"]["Asterix"]["best_variant_mean"] == pytest.approx(1.1)
    assert len(p["normalized"]["impala"]) == 3 and all(len(row) == 1 for row in p["normalized"]["impala"])
    assert p["normalized"]["domo-k0.9"][2] == [pytest.approx(1.0)]  # Breakout's best run
    md = (tmp_path / "out/domo_minatar.md").read_text()
    assert "Left out of the aggregate: Asterix." in md and "over games (Breakout) x seeds" in md


def test_an_unfinished_run_leaves_its_cells_out_of_the_comparison(mod, tmp_path):
    a = args(mod, tmp_path)
    for g in GAMES:
        for v in mod.VARIANTS:
            for s in (0, 1, 2):
                short = g == "Asterix" and v == "domo-k0.9" and s == 2
                fabricate(a.runs_dir, g, v, s, frames=FRAMES // 2 if short else FRAMES,
                          commit="def5678" if g == "Breakout" and s == 1 else "abc1234")
    p = mod.summarize(a)
    # both games on seeds 0-1 (4 cells) beat Breakout alone on seeds 0-2 (3 cells)
    assert p["games"] == GAMES and p["seeds"] == [0, 1]
    assert set(p["not_compared"]) == {f"Asterix/{v}-s2" for v in mod.VARIANTS} | \
        {f"Breakout/{v}-s2" for v in mod.VARIANTS}
    assert p["not_compared"]["Asterix/domo-k0.9-s2"] == FRAMES // 2
    assert p["commit"] == "abc1234, def5678"  # every commit the compared runs recorded
    assert len(p["normalized"]["impala"]) == 2 and len(p["normalized"]["impala"][0]) == 2  # [seeds][games]


def test_nothing_finished_writes_an_empty_summary(mod, tmp_path):
    a = args(mod, tmp_path)
    fabricate(a.runs_dir, "Breakout", "impala", 0, frames=FRAMES // 2)
    p = mod.summarize(a)
    assert p["games"] == [] and p["aggregate"] == {} and p["not_compared"] == {"Breakout/impala-s0": FRAMES // 2}
    assert "none yet" in (tmp_path / "out/domo_minatar.md").read_text()


def test_random_play_is_measured_through_the_env(mod):
    pytest.importorskip("minatar")
    r = mod.random_score("Breakout", steps=640, num_envs=8, seed=0)
    assert r["steps"] == 640 and r["episodes"] > 10  # a random Breakout episode lasts about 10 steps
    assert 0 < r["std"] < 5  # its returns: 0 to a few bricks
    assert 0 <= r["return"] < 2
    assert mod.random_score("Breakout", steps=640, num_envs=8, seed=0) == r  # seeded


def test_runs_continued_past_the_budget_are_read_up_to_it(mod, tmp_path):
    """The study at 2M frames read from runs that went on to 5M: curves and finals stop at the budget."""
    a = args(mod, tmp_path)
    for g in GAMES:
        for v in mod.VARIANTS:
            fabricate(a.runs_dir, g, v, 0, frames=2 * FRAMES + 640)
    p = mod.summarize(a)
    run = p["per_game"]["Breakout"]["variants"]["domo-k0.9"]["0"]
    assert run["frames"] == FRAMES and run["curve"][-1][0] == FRAMES and len(run["curve"]) == 10
    assert run["final"] == pytest.approx(level("domo-k0.9", "Breakout", 0))
