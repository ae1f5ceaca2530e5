"""The run runtime every training loop shares: device and threads, generator, run directory, logger,
checkpointer, counters, finite checks, progress bar, and the helpers loops need around their data flow.

A loop is written as

    with RunContext(entry, run, cfg, run_dir, resume, unit="step") as ctx:
        ck = ctx.checkpoint            # the loaded checkpoint on resume, else None
        ...build env / storage / algorithm with ctx.device and ctx.gen...
        ctx.start(total, done)          # config.json, metrics (append-only), TensorBoard, progress bar
        while ...:
            info = update()             # device tensors
            if log step: ctx.log({"step": ..., **ctx.floats(info)}), ctx.check_finite(...)
            if checkpoint step: ctx.save(payload)

and expresses nothing but its data flow: the context restores process-wide settings (threads) on exit,
closes the logger and the bar, and says in one sentence where the last good checkpoint is when training
diverges (or that there is none yet).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ctrl_rl.core.obs import obs_nbytes
from ctrl_rl.core.perf import ThreadGovernor, default_threads, tune_allocator
from ctrl_rl.core.provenance import code_version
from ctrl_rl.core.seeding import seed_everything
from ctrl_rl.envs.registry import make_env, spec_of
from ctrl_rl.envs.wrappers import ActionRescale, EpisodeStats, RewardScale, rescaled_spec
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import global_rng_state, load_checkpoint, save_checkpoint, set_global_rng_state
from ctrl_rl.learn.config import RunConfig, save_config, to_dict
from ctrl_rl.learn.logging import RunLogger
from ctrl_rl.learn.progress import progress_bar
from ctrl_rl.storage.datasets.loader import dataset_fingerprint


class TrainingDiverged(RuntimeError):
    """A loss or parameter became NaN/inf; the last good checkpoint is kept."""


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    iterations: int
    last_return: float
    wall_time: float
    algo: Any


def setup_device(device_name: str, threads: int) -> torch.device:
    """Check the device, set torch's intra-op threads (0 keeps torch's default) and tune the CPU allocator."""
    device = torch.device(device_name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError("--device cuda was requested but torch reports no CUDA device: "
                             "expected --device cpu on this machine")
    if threads > 0:
        torch.set_num_threads(threads)
    if device.type == "cpu":
        tune_allocator()
    return device


def available_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on ``device`` (CPU: the kernel's MemAvailable), or None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(nbytes: int, what: str, flags: str, device: torch.device) -> None:
    """Refuse, in one sentence, an allocation that cannot fit before the allocator fails deep inside torch."""
    free = available_memory(device)
    if free is not None and nbytes > free:
        raise UserInputError(f"{what} needs {nbytes / 2**30:,.1f} GiB but only {free / 2**30:,.1f} GiB of "
                             f"{device.type} memory is available: expected smaller {flags}")


def probe_spec(run: RunConfig):
    """The spec of ``run.env`` (``spec_of``: no env built where its backend can avoid it); checks the id before
    anything large is built."""
    return spec_of(run.env)


def training_spec(run: RunConfig):
    """The spec of the env ``build_env`` makes for ``run`` (actions rescaled to [-1, 1]), without building it."""
    return rescaled_spec(spec_of(run.env))


# A torch-native env keeps a few tensors of the observation's size per env (state, observation, final
# observation, episode statistics): an estimate of what N envs take, to refuse impossible --num-envs early.
ENV_OBS_COPIES = 16


def check_env_memory(run: RunConfig, spec, num_envs: int, device: torch.device) -> None:
    per_env = max(obs_nbytes(spec.parts), 4) * ENV_OBS_COPIES
    check_memory(num_envs * per_env, f"--num-envs {num_envs} of {run.env}", "--num-envs", device)


def load_state(obj, state: dict, what: str, path) -> None:
    """``obj.load_state_dict(state)``, with a mismatch (tensor shapes, missing keys) said in one sentence."""
    try:
        obj.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise UserInputError(f"checkpoint {str(path)!r} does not fit this run's {what} ({first}): "
                             "expected a checkpoint written with the same config") from None


def build_env(run: RunConfig, num_envs: int, seed: int, gamma: float = 0.99):
    """``run.env`` with the training wrappers: episode statistics, actions rescaled to [-1, 1] (continuous),
    reward scaling with ``gamma`` when ``run.reward_scale``."""
    env = make_env(run.env, num_envs=num_envs, device=run.device, seed=seed)
    env = EpisodeStats(env)
    if not env.spec.discrete:
        env = ActionRescale(env)
    if run.reward_scale:
        env = RewardScale(env, gamma=gamma)
    return env


def floats(info: dict) -> dict[str, float]:
    """An update's info with every device tensor converted to a float in one host sync."""
    keys = [k for k, v in info.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in info.items() if not isinstance(v, torch.Tensor)}
    if keys:
        out.update(zip(keys, torch.stack([info[k].detach().float().reshape(()) for k in keys]).tolist()))
    return {k: out[k] for k in info}


class RunContext:
    """The shared run context of one training loop call (see the module docstring).

    ``threads`` (``run.threads`` 0 on CPU): every loop runs under a ``core.perf.ThreadGovernor``, up to every
    usable core while the machine is otherwise idle and one thread while other processes use the cores, adapted
    every 0.3 s. Alone, a second core gains PPO ~1.5x (minibatches of thousands of rows), the dynamics fit and the
    model-based loops 1.5-1.8x (experiments/model_based_speed), and SAC at batch 256 with 256x256 networks ~1.4x
    (HalfCheetah-v5, 1,000 random and 5,000 learning steps, whole process: 33-34 s with ``--threads 2`` against
    47.3 s on one thread, which was the off-policy and offline loops' default before); tiny networks (64x64) gain
    nothing (``core.perf.default_threads``). Under contention one thread is what keeps two runs side by side near
    their solo time: with two fixed threads every small op's barrier waits for a descheduled worker (4.5 instead
    of 94 SAC updates/s; PPO 3-5x its solo time, experiments/contention/contention.md). The thread count changes
    float rounding, so bit-identical reruns and resumes need a fixed ``--threads N``; an adaptive run is
    reproducible only as long as its thread count is (it stays at every core on an otherwise idle machine).
    """

    def __init__(self, algo_name: str, run: RunConfig, cfg: Any, run_dir: Path, resume: bool,
                 is_main: bool = True):
        self.algo_name, self.run, self.cfg, self.run_dir = algo_name, run, cfg, Path(run_dir)
        self.loop = run.loop
        self.resume, self.is_main = resume, is_main
        self.ck_dir = self.run_dir / "checkpoints"
        self.threads_on_entry = torch.get_num_threads()  # restored on exit: thread settings are process-wide
        self.precision_on_entry = torch.get_float32_matmul_precision()  # likewise
        torch.set_float32_matmul_precision(run.matmul_precision)
        self.device = setup_device(run.device, run.threads)
        self.governor: ThreadGovernor | None = None
        if run.threads == 0 and self.device.type == "cpu":
            most = min(default_threads("cpu"), self.threads_on_entry)
            if most > 1:
                self.governor = ThreadGovernor(most)
            else:
                torch.set_num_threads(1)
        self.checkpoint: dict | None = None
        self.counters: dict = {}
        if resume:
            self.checkpoint = load_checkpoint(self.ck_dir / "latest.pt", expect_algo=algo_name)
            self.counters = dict(self.checkpoint["counters"])
        self.wall0 = float(self.counters.get("wall_time", 0.0))
        self.t_start = time.time()
        self.logger: RunLogger | None = None
        self.bar = None
        self.saved = False  # a checkpoint of this run exists (written now or before a resume)

    # -- set-up ---------------------------------------------------------------------------------------
    def seed(self, seed: int) -> torch.Generator:
        """Seed every RNG of the run; on resume the global RNG state comes from the checkpoint afterwards."""
        self.gen = seed_everything(seed, self.device)
        return self.gen

    def restore_rng(self) -> None:
        if self.checkpoint is not None:
            set_global_rng_state(self.checkpoint["rng"])

    def _saved_config(self) -> dict:
        """The config.json a resumed run wrote before (empty when it cannot be read, or for a new run)."""
        if not self.resume:
            return {}
        try:
            saved = json.loads((self.run_dir / "config.json").read_text())
        except (OSError, ValueError):
            return {}
        return saved if isinstance(saved, dict) else {}

    def _code(self, saved: dict) -> dict:
        """config.json's ``code``: ``started`` (the first launch's :func:`code_version`), and ``resumed`` (the
        latest resume's) when a resume ran other code."""
        now = code_version()
        if not self.resume:
            return {"started": now}
        code = saved.get("code")
        started = code.get("started") if isinstance(code, dict) else None  # None: written before it was recorded
        return {"started": started} | ({"resumed": now} if started != now else {})

    def _data(self, saved: dict) -> dict | None:
        """config.json's ``data``: what ``--dataset`` held when the run started (``dataset_fingerprint``: path,
        size, sha256). A resume on other data is refused: a generated id can name other rows after a
        regeneration, or on another machine (``ctrl_rl.datagen.generate``, medium-replay)."""
        if self.run.dataset is None:
            return None
        data = {"dataset": self.run.dataset, **dataset_fingerprint(self.run.dataset)}
        before = saved.get("data")
        if isinstance(before, dict) and before.get("sha256") not in (None, data["sha256"]):
            raise UserInputError(
                f"cannot resume {self.run_dir}: --dataset {self.run.dataset} now holds other data ({data['path']}, "
                f"sha256 {data['sha256'][:12]}) than the run trained on ({before.get('path')}, sha256 "
                f"{str(before['sha256'])[:12]}): expected the same data, or a new run directory")
        return data

    def start(self, total: int, done: int, desc: str, unit: str = "step") -> None:
        """Write the resolved config (with the code and the data it runs on), open the metrics (rows after the
        checkpoint dropped) and the progress bar."""
        self.saved = self.checkpoint is not None
        if self.is_main:
            saved = self._saved_config()
            data = self._data(saved)  # before anything is written: a refused resume leaves the run as it was
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.ck_dir.mkdir(exist_ok=True)
            save_config(self.run_dir / "config.json", self.algo_name, self.run, self.cfg, self._code(saved), data)
            self.logger = RunLogger(self.run_dir, resume_step=self.counters.get("step") if self.resume else None,
                                    resume_offset=self.counters.get("metrics_offset") if self.resume else None)
        self.bar = progress_bar(self.run.progress and self.is_main, total, done, desc, unit)
        self.t_start = time.time()

    # -- during the run -------------------------------------------------------------------------------
    def wall_time(self) -> float:
        return self.wall0 + time.time() - self.t_start

    def floats(self, info: dict) -> dict[str, float]:
        return floats(info)

    def check_finite(self, values: dict[str, float], algo, where: str) -> None:
        """Stop with TrainingDiverged if a logged value or a parameter is NaN/inf."""
        bad = [k for k, v in values.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad or not algo.parameters_finite():
            what = f"loss {bad[0]}" if bad else "a network parameter"
            if self.saved:
                kept = f"the last good checkpoint is {self.ck_dir / 'latest.pt'}"
            else:
                kept = "no checkpoint was written yet, so the run must be restarted"
            raise TrainingDiverged(f"training diverged at {where}: {what} became NaN/inf; {kept}")

    def log(self, row: dict) -> None:
        if self.logger is not None:
            self.logger.log(row)

    def advance(self, n: int, postfix: str | None = None) -> None:
        if self.bar is not None:
            if postfix is not None:
                self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(n)

    def save(self, payload: dict, counters: dict, name: str = "latest.pt") -> None:
        """Write a checkpoint: the algorithm name, the resolved config, the global RNG states and ``counters``
        (plus the wall time) next to ``payload`` (algo_state, env_state, ...)."""
        if not self.is_main:
            return
        offset = {}
        if self.logger is not None and name == "latest.pt":
            self.logger.sync()  # the rows the checkpoint counts are on disk before it is
            offset = {"metrics_offset": self.logger.offset}
        data = {"algo": self.algo_name, "config": {"run": to_dict(self.run), "algo": to_dict(self.cfg)},
                "rng": global_rng_state(), **payload,
                "counters": {**counters, "wall_time": self.wall_time(), **offset}}
        save_checkpoint(self.ck_dir / name, data)
        if name == "latest.pt":
            self.saved = True

    def cap_threads(self, most: int) -> None:
        """At most ``most`` torch threads from now on (the governor keeps adapting below that)."""
        if self.governor is not None:
            self.governor.cap(most)
        else:
            torch.set_num_threads(min(most, torch.get_num_threads()))

    # -- tear-down ------------------------------------------------------------------------------------
    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.logger is not None:
            self.logger.close()
            self.logger = None
        if self.governor is not None:
            self.governor.close()
            self.governor = None
        torch.set_num_threads(self.threads_on_entry)
        torch.set_float32_matmul_precision(self.precision_on_entry)

    def __enter__(self) -> RunContext:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
