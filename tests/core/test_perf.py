"""The thread governor's decisions, driven by a fake /proc/stat sampler, and its wiring into the runtime."""

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


def test_default_threads_per_loop_kind(monkeypatch):
    monkeypatch.setattr(perf, "usable_cores", lambda: 8)
    assert perf.default_threads("cpu", "large-batches") == 8
    assert perf.default_threads("cpu", "small-batches") == 1
    assert perf.default_threads("cuda", "large-batches") == 0
    with pytest.raises(ValueError):
        perf.default_threads("cpu", "bandit")


def test_run_context_governs_ppo_and_pins_offpolicy_and_restores(tmp_path, clock):
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
    run = ensure_loop(registry.get("sac"), RunConfig(env="torch:Pendulum", threads=0, progress=False))
    with RunContext("sac", run, None, tmp_path / "b", resume=False, single_thread=True) as ctx:
        assert ctx.governor is None and torch.get_num_threads() == 1
    run = ensure_loop(registry.get("ppo"), RunConfig(env="torch:Pendulum", threads=2, progress=False))
    with RunContext("ppo", run, None, tmp_path / "c", resume=False) as ctx:
        assert ctx.governor is None and torch.get_num_threads() == 2  # --threads N is never adapted
    assert torch.get_num_threads() == 2
