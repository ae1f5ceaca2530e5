"""experiments/sac_default_speed: the governor's decisions read back from what CTRL_RL_THREAD_LOG=1 prints."""

import sys

import torch

from ctrl_rl.core import perf
from tests.scripts import experiment_script


def test_thread_decisions_reads_the_governors_log(monkeypatch, capsys):
    samples = iter([(100.0, {0: 0, 1: 0}, 0.0), (101.0, {0: 50, 1: 50}, 0.0), (102.0, {0: 100, 1: 100}, 0.0),
                    (103.0, {0: 100, 1: 100}, 0.0), (104.0, {0: 100, 1: 100}, 0.0)])
    monkeypatch.setattr(perf, "_cpu_sample", lambda: next(samples))
    monkeypatch.setattr(perf, "_affinity", lambda: [0, 1])
    monkeypatch.setattr(perf, "_START", (99.0, {0: 0, 1: 0}, 0.0))
    monkeypatch.setattr(perf, "_TICK", 100)  # the samples' busy ticks: 100 a second is one core
    monkeypatch.setenv("CTRL_RL_THREAD_LOG", "1")
    monkeypatch.delenv("CTRL_RL_FIXED_THREADS", raising=False)
    n = torch.get_num_threads()
    gov = perf.ThreadGovernor(2, interval=0.5, hook=False)  # a quiet start: 2 threads
    for _ in range(4):  # other processes use a core for two windows, then none for two: 2 -> 1 -> 2
        gov.poll()
    gov.close()
    torch.set_num_threads(n)
    err = capsys.readouterr().err
    with experiment_script("experiments/sac_default_speed/sac_default_speed.py", "bench_sac_default_speed") as m:
        got = m.thread_decisions(err + "\nsome other line\n")
    assert got["start"] == 2 and got["changes"] == 2 and got["last"] == 2, (got, err)
    assert got["log"][0].startswith("2 -> 1")
    sys.modules.pop("common", None)  # the script imported experiments/common.py under that name
