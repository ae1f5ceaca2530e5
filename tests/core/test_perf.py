"""The thread policy: the governor's decisions as a pure function of other processes' load, the governor
driven by a fake /proc/stat sampler, and its wiring into every loop's runtime."""

import pytest
import torch

from ctrl_rl.core import perf


class FakeClock:
    """Stands in for perf._cpu_sample: time advances by 1 s per sample; ``others`` cores' worth of CPU is
    used by other processes and ``own`` by this one in each second (2 CPUs, clock ticks of perf._TICK)."""

    def __init__(self):
        self.t, self.busy, self.own = 100.0, 0, 0.0
        self.others, self.mine = 0.0, 1.0

    def __call__(self):
        self.t += 1.0
        self.own += self.mine
        self.busy += round((self.others + self.mine) * perf._TICK)
        return self.t, {0: self.busy // 2, 1: self.busy - self.busy // 2}, self.own


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(perf, "_cpu_sample", fake)
    monkeypatch.setattr(perf, "_affinity", lambda: [0, 1])
    monkeypatch.setattr(perf, "_START", (fake.t - 2.0, {0: 0, 1: 0}, 0.0))
    monkeypatch.delenv("CTRL_RL_FIXED_THREADS", raising=False)
    n = torch.get_num_threads()
    yield fake
    torch.set_num_threads(n)


def test_governor_keeps_every_core_alone_and_drops_to_one_next_to_another_run(clock):
    gov = perf.ThreadGovernor(2, interval=0.5, hook=False)
    assert gov.threads == 2 and torch.get_num_threads() == 2  # the first window (since import) was quiet
    clock.others = 1.0  # another run starts
    assert gov.poll() == 1 and torch.get_num_threads() == 1
    assert gov.poll() == 1
    clock.others = 0.0  # it ends: back to two after calm_polls quiet windows, not at once
    assert gov.poll() == 1
    assert gov.poll() == 2 and torch.get_num_threads() == 2
    clock.others = 0.2  # light background noise stays under the slack
    assert gov.poll() == 2
    assert gov.changes == 2
    gov.close()


def test_governor_starts_at_one_thread_when_the_start_was_busy_and_respects_cap_and_close(clock, monkeypatch):
    monkeypatch.setattr(perf, "_START", (clock.t, {0: clock.busy // 2, 1: clock.busy - clock.busy // 2}, clock.own))
    clock.others = 1.0  # another run was busy since this process started
    torch.set_num_threads(2)
    gov = perf.ThreadGovernor(2, interval=0.5, hook=False)
    assert gov.threads == 1 and torch.get_num_threads() == 1
    clock.others = 0.0
    gov.poll(), gov.poll()
    assert gov.threads == 2
    gov.cap(1)
    assert torch.get_num_threads() == 1
    gov.poll(), gov.poll(), gov.poll()
    assert gov.threads == 1  # never above the cap
    gov.close()
    assert torch.get_num_threads() == 2  # the count found at construction


def test_fixed_threads_env_disables_adaptation(clock, monkeypatch):
    monkeypatch.setenv("CTRL_RL_FIXED_THREADS", "1")
    clock.others = 1.0
    gov = perf.ThreadGovernor(2, interval=0.5, hook=False)
    assert gov.threads == 2 and gov.poll() == 2
    gov.close()


def test_governor_polls_from_optimizer_steps(clock):
    gov = perf.ThreadGovernor(2, interval=0.5)
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.1)
    clock.others = 1.0
    p.grad = torch.ones(2)
    opt.step()
    assert gov.threads == 1 and torch.get_num_threads() == 1
    gov.close()
    p.grad = torch.ones(2)
    clock.others = 0.0
    opt.step()  # the hook is gone: nothing changes any more
    assert gov.threads == 1


def test_default_threads_is_every_usable_core_on_cpu_only(monkeypatch):
    monkeypatch.setattr(perf, "usable_cores", lambda: 8)
    assert perf.default_threads("cpu") == 8
    assert perf.default_threads("cuda") == 0


def test_fit_threads_rounds_busy_cores_up_beyond_the_slack():
    assert perf.fit_threads(0.0, cpus=2, max_threads=2, slack=0.35) == 2
    assert perf.fit_threads(0.3, cpus=2, max_threads=2, slack=0.35) == 2  # background noise
    assert perf.fit_threads(0.4, cpus=2, max_threads=2, slack=0.35) == 1  # a core taken, partly
    assert perf.fit_threads(3.0, cpus=2, max_threads=2, slack=0.35) == 1  # never below one
    assert perf.fit_threads(0.0, cpus=8, max_threads=2, slack=0.35) == 2  # never above max_threads
    assert perf.fit_threads(2.5, cpus=8, max_threads=8, slack=0.35) == 5


def decide(loads, threads=2, cpus=2, max_threads=2, **kw):
    """The thread counts ``next_threads`` chooses after each window of other processes' load in ``loads``."""
    out, calm = [], 0
    for load in loads:
        threads, calm = perf.next_threads(threads, load, cpus, max_threads, calm, **kw)
        out.append(threads)
    return out


def test_next_threads_drops_at_once_and_rises_after_calm_windows():
    # another run starts (1 core busy), stays, ends: one thread at once, two after two quiet windows
    assert decide([0.0, 1.0, 1.0, 0.0, 0.0, 0.1]) == [2, 1, 1, 1, 2, 2]
    # a busy window between quiet ones resets the calm count
    assert decide([1.0, 0.0, 1.0, 0.0, 0.0], threads=1) == [1, 1, 1, 1, 2]
    # load between the slacks (0.15 < x <= 0.35) neither drops nor counts as calm
    assert decide([0.3, 0.3, 0.3]) == [2, 2, 2]
    assert decide([0.0, 0.3, 0.0, 0.0], threads=1) == [1, 1, 1, 2]
    # more cores: one step up per calm_polls windows, straight down to what fits
    assert decide([0.0] * 6, threads=1, cpus=4, max_threads=4) == [1, 2, 2, 3, 3, 4]
    assert decide([2.0], threads=4, cpus=4, max_threads=4) == [2]
    assert decide([0.0, 0.0, 0.0], threads=1, calm_polls=1) == [2, 2, 2]


def test_every_regime_is_governed_at_threads_0_and_fixed_at_threads_n(tmp_path, clock, monkeypatch):
    """Every regime (on-policy, off-policy, offline) is governed at --threads 0 on CPU; --threads N is fixed."""
    from ctrl_rl.algos import registry
    from ctrl_rl.learn.config import RunConfig, ensure_loop
    from ctrl_rl.learn.runtime import RunContext

    torch.set_num_threads(2)
    for algo in ("ppo", "sac", "iql"):
        run = ensure_loop(registry.get(algo), RunConfig(env="torch:Pendulum", threads=0, progress=False))
        clock.others = 0.0
        with RunContext(algo, run, None, tmp_path / algo, resume=False) as ctx:
            assert ctx.governor is not None and ctx.governor.max_threads == 2
            assert torch.get_num_threads() == 2  # alone: every core
            clock.others = 1.0  # another process takes a core
            assert ctx.governor.poll() == 1 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        run = ensure_loop(registry.get(algo), RunConfig(env="torch:Pendulum", threads=2, progress=False))
        with RunContext(algo, run, None, tmp_path / f"{algo}-fixed", resume=False) as ctx:
            assert ctx.governor is None and torch.get_num_threads() == 2  # --threads N is never adapted
    torch.set_num_threads(1)  # torch's count at entry caps the auto count (OMP_NUM_THREADS=1, a caller's setting)
    run = ensure_loop(registry.get("sac"), RunConfig(env="torch:Pendulum", threads=0, progress=False))
    with RunContext("sac", run, None, tmp_path / "one", resume=False) as ctx:
        assert ctx.governor is None and torch.get_num_threads() == 1


def test_run_context_cap_threads_and_restores(tmp_path, clock):
    from ctrl_rl.algos import registry
    from ctrl_rl.learn.config import RunConfig, ensure_loop
    from ctrl_rl.learn.runtime import RunContext

    torch.set_num_threads(2)
    run = ensure_loop(registry.get("ppo"), RunConfig(env="torch:Pendulum", threads=0, progress=False))
    with RunContext("ppo", run, None, tmp_path / "a", resume=False) as ctx:
        assert ctx.governor is not None and ctx.governor.max_threads == 2
        ctx.cap_threads(1)
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
