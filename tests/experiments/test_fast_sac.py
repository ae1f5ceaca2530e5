"""experiments/fast_sac/fast_sac.py's summary on fabricated runs: each seed's time to a return, medians, seeds that
never got there (a censored median is a lower bound and gives no ratio), the baselines' ratios to fastsac, and its
VARIANT=VALUE flags."""

import pytest

from tests.scripts import experiment_script


@pytest.fixture(scope="module")
def fs():
    with experiment_script("experiments/fast_sac/fast_sac.py", "fast_sac_bench") as mod:
        yield mod


def run(variant: str, seed: int, points: list[tuple[int, float, float]]) -> tuple[str, dict]:
    """A results entry: ``points`` = (env step, training seconds, evaluation return)."""
    return f"{variant}/{seed}", {"variant": variant, "seed": seed,
                                 "curve": [[s, t, t + 1.0, r] for s, t, r in points]}


def test_times_medians_and_ratios(fs):
    runs = dict([
        run("fastsac", 0, [(0, 0, 0), (10, 100, 3100), (20, 200, 5200)]),
        run("fastsac", 1, [(0, 0, 0), (10, 150, 2000), (20, 300, 3500)]),
        run("fastsac", 2, [(0, 0, 0), (10, 120, 3000), (20, 400, 4000)]),  # never 5000: censored at 400 s
        run("sb3", 0, [(0, 0, 0), (10, 600, 3200)]),
        run("sb3", 1, [(0, 0, 0), (10, 450, 3300)]),
        run("sb3", 2, [(0, 0, 0), (10, 900, 2900)]),  # never 3000: counts as 900 s, above the median
    ])
    s = fs.summarize(runs)
    f3 = s["fastsac"]["to_3000"]
    assert f3["train_s"] == [100, 300, 120] and f3["step"] == [10, 20, 10]
    assert f3["median_s"] == 120 and not f3["censored"]
    assert s["fastsac"]["final_return"] == [5200, 3500, 4000] and s["fastsac"]["final_return_median"] == 4000
    # fastsac to 5000: 200 s, never (last at 300 s), never (400 s): the median is a never-reached seed's time
    f5 = s["fastsac"]["to_5000"]
    assert f5["train_s"] == [200, None, None] and f5["median_s"] == 300 and f5["censored"]
    # SB3's censored seed lies above its median (450, 600, 900): the median stands
    b3 = s["sb3"]["to_3000"]
    assert b3["median_s"] == 600 and not b3["censored"]
    r3 = s["speedup_vs_sb3_to_3000"]
    assert (r3["ratio"], r3["lower_bound"]) == (5.0, False)
    # the same-invocation ratio of each seed: 600/100, 450/300, and 900/120 as a lower bound (SB3 never got there)
    assert r3["per_seed"] == {"0": {"ratio": 6.0, "lower_bound": False}, "1": {"ratio": 1.5, "lower_bound": False},
                              "2": {"ratio": 7.5, "lower_bound": True}}
    assert r3["median_of_seed_ratios"] == 6.0 and not r3["median_of_seed_ratios_lower_bound"]
    # no ratio of medians where fastsac's own median is censored, but the seed that got there has its own ratio;
    # no SAC entries without SAC runs
    assert "ratio" not in s["speedup_vs_sb3_to_5000"] and set(s["speedup_vs_sb3_to_5000"]["per_seed"]) == {"0"}
    assert "sac" not in s and "speedup_vs_sac_to_3000" not in s


def test_a_censored_baseline_gives_a_lower_bound(fs):
    runs = dict([
        run("fastsac", 0, [(0, 0, 0), (10, 100, 3100)]),
        run("sac", 0, [(0, 0, 0), (10, 500, 2500)]),  # stopped at its budget below 3000
    ])
    s = fs.summarize(runs)
    assert s["sac"]["to_3000"]["censored"] and s["sac"]["to_3000"]["median_s"] == 500
    r = s["speedup_vs_sac_to_3000"]
    assert (r["ratio"], r["lower_bound"]) == (5.0, True) and r["median_of_seed_ratios_lower_bound"]


def test_an_even_count_median_with_a_censored_seed_is_a_lower_bound(fs):
    """Two seeds: the median averages both, so a seed that never got there (its time at least its last) makes the
    median a lower bound even when it is the slower one."""
    runs = dict([
        run("fastsac", 0, [(0, 0, 0), (10, 100, 3100)]),
        run("fastsac", 1, [(0, 0, 0), (10, 100, 3100)]),
        run("sac", 0, [(0, 0, 0), (10, 400, 3100)]),
        run("sac", 1, [(0, 0, 0), (10, 600, 2500)]),  # never 3000
    ])
    s = fs.summarize(runs)
    assert s["sac"]["to_3000"]["median_s"] == 500 and s["sac"]["to_3000"]["censored"]
    r = s["speedup_vs_sac_to_3000"]
    assert (r["ratio"], r["lower_bound"]) == (5.0, True)
    # per seed 4.0 and >= 6.0: their mean is the median, a lower bound
    assert r["median_of_seed_ratios"] == 5.0 and r["median_of_seed_ratios_lower_bound"]


def test_cpu_name_names_the_widest_vector_extension(fs):
    def info(flags: str) -> str:
        return f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags} ht\n"

    assert fs.cpu_name(info("avx2 fma")) == "Some CPU (AVX2)"
    assert fs.cpu_name(info("avx2 avx512f avx512bw")) == "Some CPU (AVX-512)"
    assert fs.cpu_name(info("avx2 avx512f amx_bf16 amx_tile")) == "Some CPU (AMX)"
    assert fs.cpu_name("flags: sse2\n") == "unknown (-)"


def test_per_variant_flags(fs):
    assert fs.per_variant(["sb3=1200", "fastsac=600"], fs.BUDGET_S, float, "--budget-s") == {
        **fs.BUDGET_S, "sb3": 1200.0, "fastsac": 600.0}
    for bad in ("td3=10", "sb3"):
        with pytest.raises(SystemExit, match="expected VARIANT=VALUE"):
            fs.per_variant([bad], fs.BUDGET_S, float, "--budget-s")


def test_run_commands_with_and_without_a_work_dir(fs, tmp_path):
    import argparse

    a = argparse.Namespace(work_dir=None, checkpoint_every=100_000, eval_every=10_000, eval_episodes=10)
    cmd, resumed = fs.ctrl_rl_command("fastsac", 2, 1_000_000, a, tmp_path / "fastsac-s2")
    assert not resumed and cmd[cmd.index("--checkpoint-every") + 1] == str(10**9) and "--save-replay" not in cmd
    assert cmd[cmd.index("--seed") + 1] == "2" and "--preset" in cmd
    a.work_dir = tmp_path
    run_dir = tmp_path / "fast_sac_1m" / "fastsac-s2"
    cmd, resumed = fs.ctrl_rl_command("fastsac", 2, 1_000_000, a, run_dir)
    # ctrl_rl counts --checkpoint-every in loop iterations: the preset's 16 envs make 100,000 env steps 6,250 of them
    assert not resumed and cmd[cmd.index("--checkpoint-every") + 1] == "6250" and "--save-replay" in cmd
    assert fs.envs_per_iteration("fastsac") == 16 and fs.envs_per_iteration("sac") == 1
    sac_cmd, _ = fs.ctrl_rl_command("sac", 2, 1_000_000, a, tmp_path / "sac-s2")
    assert sac_cmd[sac_cmd.index("--checkpoint-every") + 1] == "100000"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest.pt").write_bytes(b"x")  # an interrupted run: continued, not restarted
    cmd, resumed = fs.ctrl_rl_command("fastsac", 2, 1_000_000, a, run_dir)
    assert resumed and cmd[cmd.index("--resume") + 1] == str(run_dir) and "--seed" not in cmd
    assert cmd[cmd.index("--total-steps") + 1] == "1000000"
