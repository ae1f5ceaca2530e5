"""The deployment runtime: an exported policy driving a robot at a fixed rate, behind a safety filter and a watchdog.

One control tick (``ControlLoop.tick``):

1. ``robot.observe()``: the observation parts (batch-less NumPy arrays, named as the export's inputs) and the
   time they were measured. An observation older than ``max_obs_age`` seconds is **stale**: the loop commands
   a safe stop (``robot.stop()``) and ends.
2. The policy (an onnxruntime session of ``policy.onnx``; any callable of the input dict for tests): batch 1.
   A recurrent policy's ``hidden``, previous action and reward are carried here and zeroed at an episode start.
3. ``SafetyFilter`` (``robots/safety.py``): non-finite commands held, bounds, rate, joint and workspace limits.
   Every intervention is counted, the first of each kind is logged to stderr, and an optional JSONL log gets
   every tick. Nothing unfiltered is ever sent.
4. ``robot.send(command)``.
5. Wait for the next deadline (``1 / rate`` after the previous one). A tick that ends after its deadline is a
   **miss**; ``max_misses`` misses in a row command a safe stop. ``rate=0`` runs as fast as it can (simulation
   checks) and has no deadlines.

Latencies are kept per tick: the policy's inference alone and the whole tick without the wait (p50 / p99 in
``stats()``).

A policy may have no action for a tick (the policy server of ``ctrl-rl serve`` is unreachable, or its answer is
late: ``deploy/client.py``): it raises ``PolicyUnavailable``, and the loop commands the safe action
(``robot.stop()``) for that tick, logs the first tick of each outage and goes on when the policy answers again. A
late answer counts as a missed deadline; an outage longer than ``max_outage`` seconds, or ``PolicyRefused``,
makes a safe stop. A policy that keeps its own queue of chunk actions (``ActionStream``: the remote chunk policy,
which asks for the next chunk before its queue runs dry) gives one action per tick.

``RobotInterface`` is what a real robot driver implements (docs/guides/export-deploy.md#deploying-on-a-robot); it
reads the robot from the export (``export_robot``: limits, rate, PD gains) and the safety filter's joint and
end-effector positions from the observation at the export's slices (``robot_state``), with no task built;
``SimRobot`` is the
simulator implementation over any ctrl_rl env (``make_env`` with one env, actions in the env's own units, i.e.
without the training wrappers' rescaling: the export's output is already in those units).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.safety import RobotState, SafetyConfig, SafetyFilter
from ctrl_rl.robots.spec import ActionSpace, RobotSpec


@dataclass
class Observation:
    parts: dict[str, np.ndarray]
    """Observation parts by export input name (``state``, ``image.wrist_image_left``, ...), without a batch dim."""
    stamp: float
    """``time.monotonic()`` when it was measured."""
    episode_start: bool = False
    """True on the first observation of an episode (recurrent state and the filter's memory restart)."""
    state: RobotState = field(default_factory=RobotState)
    """What the safety filter needs (joint positions, end-effector position), when the robot knows it."""
    reward: float = 0.0
    """The reward of the previous tick where the robot's task defines one (a recurrent policy reads it; 0 else)."""


@runtime_checkable
class RobotInterface(Protocol):
    def observe(self) -> Observation: ...

    def send(self, command: np.ndarray) -> None: ...

    def stop(self) -> None:
        """Bring the robot to a safe standstill (hold position); called by the watchdog and at the end."""
        ...


# ------------------------------------------------------------------------------------------------ simulator
class SimRobot:
    """A ctrl_rl env (one instance) behind ``RobotInterface``; episodes restart automatically.

    ``episodes`` holds one dict per finished episode: return, length and success (when the env reports
    ``info["success"]``). An env whose spec has a ``robot_state_layout`` (the manipulation tasks: column ranges of
    the joint positions and the end-effector position in its ``state`` vector) gives the filter what it checks.
    """

    def __init__(self, env_id: str, seed: int = 0):
        import torch

        from ctrl_rl.envs.registry import make_env

        self._torch = torch
        self.env = make_env(env_id, num_envs=1, device="cpu", seed=seed)
        self.spec = self.env.spec
        self.names = {p.name: p.name.replace("/", ".") for p in self.spec.parts}
        self._obs = self.env.reset(seed=seed)
        self._start = True
        self._ret, self._len, self._success = 0.0, 0, False
        self._reward = 0.0
        self.episodes: list[dict] = []
        self.stopped = 0

    @property
    def robot(self) -> RobotSpec | None:
        return self.spec.robot

    def _state(self) -> RobotState:
        layout = self.spec.robot_state_layout
        if layout is None:
            return RobotState()
        state = (self._obs["state"] if isinstance(self._obs, dict) else self._obs)[0].cpu().numpy()  # [O]
        (a, b), (c, d) = layout.joint_position, layout.ee_position
        return RobotState(joint_position=state[a:b].astype(np.float64), ee_position=state[c:d].astype(np.float64))

    def observe(self) -> Observation:
        obs = self._obs if isinstance(self._obs, dict) else {"state": self._obs}
        parts = {self.names[k]: v[0].cpu().numpy() for k, v in obs.items()}
        return Observation(parts, time.monotonic(), self._start, self._state(), 0.0 if self._start else self._reward)

    def send(self, command: np.ndarray) -> None:
        torch = self._torch
        a = torch.as_tensor(np.asarray(command)[None])
        a = a.long().reshape(1) if self.spec.discrete else a.float()
        out = self.env.step(a)
        self._reward = float(out.reward[0])
        self._ret += self._reward
        self._len += 1
        if "success" in out.info:
            self._success |= bool(out.info["success"][0])
        self._start = bool(out.done[0])
        if self._start:
            self.episodes.append({"return": self._ret, "length": self._len,
                                  "success": self._success if "success" in out.info else None})
            self._ret, self._len, self._success = 0.0, 0, False
        self._obs = out.obs

    def stop(self) -> None:
        self.stopped += 1

    def close(self) -> None:
        self.env.close()


# ------------------------------------------------------------------------------------------------ policy
class PolicyUnavailable(Exception):
    """No action for this tick: the policy is unreachable, or (``late``) its answer missed the tick's deadline.
    The loop holds the robot (``robot.stop()``) for the tick."""

    def __init__(self, message: str, late: bool = False):
        super().__init__(message)
        self.late = late


class PolicyRefused(Exception):
    """The policy will not answer this robot (a refused token or observation, another export): safe stop."""


@runtime_checkable
class ActionStream(Protocol):
    """A policy of action chunks that keeps its own queue (``client.RemoteChunks``): one action per tick."""

    def next_action(self, feed: Callable[[], dict[str, np.ndarray]], tick: int) -> np.ndarray:
        """The action [A] for control tick ``tick``; ``feed()`` builds the observation's inputs when it asks."""
        ...

    def reset(self) -> None:
        """An episode starts: drop the queued actions."""
        ...


class Prompter:
    """The instruction (an env's ``language`` part: UTF-8 bytes + 1, 0-padded) -> the prompt's token ids, as the
    exported VLA was trained: ``policy.json``'s ``language`` (template, tokenizer file, length, pad id)."""

    def __init__(self, export_dir: str | Path, spec: dict):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(export_dir) / spec["tokenizer"]))
        self.prompt, self.length, self.pad = spec["prompt"], int(spec["max_length"]), int(spec["pad_id"])
        self.lowercase = bool(spec.get("lowercase", True))
        self._cache: dict[bytes, np.ndarray] = {}

    def __call__(self, language: np.ndarray) -> np.ndarray:
        raw = bytes(int(b) - 1 for b in np.asarray(language).reshape(-1) if b > 0)
        hit = self._cache.get(raw)
        if hit is None:
            text = raw.decode("utf-8", errors="replace").strip().rstrip(".")
            ids = self.tokenizer.encode(self.prompt.format(text.lower() if self.lowercase else text)).ids[: self.length]
            hit = np.full(self.length, self.pad, np.int64)
            hit[: len(ids)] = ids
            self._cache[raw] = hit
        return hit


class OnnxPolicy:
    """``policy.onnx`` in onnxruntime (one thread), called with a dict of batch-1 inputs."""

    def __init__(self, path: str | Path):
        from ctrl_rl.deploy.sidecar import onnx_session

        self.session = onnx_session(path)
        self.input_names = [i.name for i in self.session.get_inputs()]

    def __call__(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        # onnxruntime types an output as any ONNX value (sparse tensor, sequence, map); an export's are dense tensors
        return cast(list[np.ndarray], self.session.run(None, inputs))


def export_robot(meta: dict) -> RobotSpec | None:
    """The robot spec an export carries (``policy.json``'s ``robot``: limits, rate, action spaces, PD gains), or None
    for an export of an env without a robot; a robot-side process reads it here instead of building the task."""
    return RobotSpec.from_dict(meta["robot"]) if meta.get("robot") else None


def robot_state(meta: dict, parts: dict[str, np.ndarray]) -> RobotState:
    """What the safety filter checks (joint and end-effector positions), read from an observation's ``state`` part
    (``parts``: by input name, no batch dim) at the slices the export's ``deploy.observation`` layout names; a slice
    the export does not name stays None."""
    state = next((o for o in (meta.get("deploy") or {}).get("observation", []) if o["part"] == "state"), None)
    if state is None or state["name"] not in parts:
        return RobotState()
    x = np.asarray(parts[state["name"]], dtype=np.float64).reshape(-1)
    cols = {s["name"]: x[s["start"]:s["stop"]] for s in state.get("slices", [])}
    return RobotState(joint_position=cols.get("joint_position"), ee_position=cols.get("ee_position"))


def action_space_of(meta: dict, robot: RobotSpec | None) -> ActionSpace:
    """The commanded action space of an export: its bounds and units, with the robot's space of the same name and
    size when there is one (its kind and per-step scale: ``delta`` spaces get joint and workspace checks)."""
    act = meta["action"]
    name = act.get("space") or "env"
    if robot is not None:
        for s in robot.action_spaces:
            if s.name == name and s.dim == len(act["low"]):
                return s
    low = np.asarray(act["low"], dtype=np.float64)
    high = np.asarray(act["high"], dtype=np.float64)
    # unbounded dimensions: the filter still needs a box; a very large one keeps only the finite guard
    low = np.where(np.isfinite(low), low, -1e9)
    high = np.where(np.isfinite(high), high, 1e9)
    return ActionSpace(name, tuple(low), tuple(high), tuple(act.get("units") or ["env"] * len(low)))


def check_compatible(meta: dict, spec, robot: RobotSpec | None, where: str) -> None:
    """Refuse, in one sentence, an export whose observation parts or action space differ from ``spec`` (the env's)."""
    encoded = {i["name"] for i in meta["inputs"] if i.get("encoding")}  # built by the runtime (a prompt's token ids)
    want = [(i["name"], tuple(i["shape"][1:]), i["dtype"]) for i in meta["inputs"] if i["name"] not in encoded]
    read = {i["name"] for i in meta["inputs"]}
    # a privileged part (simulator-only, EnvSpec.privileged_parts) the policy does not read is no input of the export
    have = [(p.name.replace("/", "."), tuple(p.shape), str(p.dtype).removeprefix("torch.")) for p in spec.parts
            if p.name.replace("/", ".") not in encoded
            and (p.name.replace("/", ".") in read or p.name not in spec.privileged_parts)]
    missing = encoded - {p.name.replace("/", ".") for p in spec.parts}
    if missing:
        raise UserInputError(f"{where} has no observation part {sorted(missing)[0]!r} the export reads its instruction "
                             "from: expected an env with an instruction (manip tasks: language=true)")
    if want != have:
        raise UserInputError(f"the export's observation parts {want} do not match {where}'s {have}: expected an export "
                             f"of a policy trained on {where}")
    act = meta["action"]
    if (act["kind"] == "discrete") != spec.discrete:
        raise UserInputError(f"the export has {act['kind']} actions and {where} "
                             f"{'discrete' if spec.discrete else 'continuous'} ones: expected the same kind")
    if spec.discrete:
        if act["n"] != spec.action_dim:
            raise UserInputError(f"the export chooses among {act['n']} actions and {where} has {spec.action_dim}: "
                                 "expected the same number")
        return
    if len(act["low"]) != spec.action_dim or not np.allclose(act["low"], spec.action_low) \
            or not np.allclose(act["high"], spec.action_high):
        raise UserInputError(f"the export's action bounds [{act['low']}, {act['high']}] differ from {where}'s "
                             f"[{list(spec.action_low)}, {list(spec.action_high)}]: expected the same action space")
    exported_robot = (meta.get("robot") or {}).get("name")
    if exported_robot and robot is not None and exported_robot != robot.name:
        raise UserInputError(f"the export was trained for robot {exported_robot!r} and {where} is robot "
                             f"{robot.name!r}: expected the same robot")


# ------------------------------------------------------------------------------------------------ the loop
@dataclass(frozen=True)
class LoopConfig:
    rate: float = 15.0
    """Control rate (Hz); 0 runs as fast as possible with no deadlines (simulation checks)."""
    max_obs_age: float = 0.5
    """An observation older than this (s) when the tick reads it is stale: safe stop."""
    max_misses: int = 3
    """This many missed deadlines in a row: safe stop."""
    max_outage: float = 30.0
    """A policy unreachable this long (s) makes a safe stop; until then every tick holds (``robot.stop()``)."""

    def __post_init__(self) -> None:
        if not (np.isfinite(self.rate) and self.rate >= 0):
            raise UserInputError(f"invalid --rate {self.rate!r}: "
                                 "expected a control rate in Hz >= 0 (0: as fast as possible)")
        if not (np.isfinite(self.max_obs_age) and self.max_obs_age > 0):
            raise UserInputError(f"invalid --max-obs-age {self.max_obs_age!r}: expected a positive number of seconds")
        if self.max_misses < 1:
            raise UserInputError(f"invalid --max-misses {self.max_misses!r}: expected an integer >= 1")
        if not self.max_outage > 0:
            raise UserInputError(f"invalid --max-outage {self.max_outage!r}: expected a positive number of seconds")


class ControlLoop:
    """See the module docstring."""

    def __init__(self, policy: Callable[[dict], list] | ActionStream, meta: dict, robot: RobotInterface,
                 safety: SafetyFilter | None,
                 config: LoopConfig = LoopConfig(), log: Path | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 prompter: Prompter | None = None):
        self.policy, self.meta, self.robot, self.safety, self.config = policy, meta, robot, safety, config
        self.clock, self.sleep = clock, sleep
        self.discrete = meta["action"]["kind"] == "discrete"
        self.recurrent = meta.get("recurrent") is not None
        self.inputs = [i["name"] for i in meta["inputs"]]
        self.dtypes = {i["name"]: np.dtype(i["dtype"]) for i in meta["inputs"]}
        self.infer_ms: list[float] = []
        self.tick_ms: list[float] = []
        self.misses = self.ticks = self._missed_in_row = 0
        self.held = self.outages = self.late = 0  # ticks without a policy action, outages, late answers
        self._outage_since: float | None = None
        self.stop_reason: str | None = None
        self._seen: set[str] = set()
        self._log = open(log, "w") if log is not None else None
        if self.recurrent:
            r = meta["recurrent"]
            self._hidden = np.zeros([1, *r["hidden"][1:]], np.float32)
            self._prev_a = np.zeros([1, *r["prev_action"][1:]], np.float32)
            self._prev_r = np.zeros([1], np.float32)
        self._deadline: float | None = None
        act = meta["action"]
        self.chunk = int(act.get("chunk") or 0)  # a chunk policy: run the first execute_steps of each chunk
        self.execute = int(act.get("execute_steps") or self.chunk)
        self._queue: list[np.ndarray] = []
        self.prompter = prompter

    def _feed(self, obs: Observation) -> dict[str, np.ndarray]:
        missing = [n for n in self.inputs if n not in obs.parts]
        if missing:
            raise UserInputError(f"the robot's observation lacks {missing}: expected the export's inputs {self.inputs}")
        feed = {n: np.asarray(obs.parts[n], dtype=self.dtypes[n])[None] for n in self.inputs}
        if self.prompter is not None:
            feed["language"] = self.prompter(obs.parts["language"])[None]
        if self.recurrent:
            if obs.episode_start:
                self._hidden[:] = 0
                self._prev_a[:] = 0
                self._prev_r[:] = 0
            else:
                self._prev_r[:] = obs.reward
            feed |= {"prev_action": self._prev_a, "prev_reward": self._prev_r, "hidden": self._hidden}
        return feed

    def _safe_stop(self, reason: str) -> None:
        self.stop_reason = reason
        print(f"ctrl-rl deploy: safe stop ({reason})", file=sys.stderr, flush=True)
        self.robot.stop()

    def tick(self) -> bool:
        """One control tick; False when the loop has stopped (stale observation or missed deadlines)."""
        start = self.clock()
        obs = self.robot.observe()
        if start - obs.stamp > self.config.max_obs_age:
            self._safe_stop(f"stale observation: {start - obs.stamp:.3f} s old > {self.config.max_obs_age} s")
            return False
        if obs.episode_start and self.safety is not None:
            self.safety.reset()
        stream = self.policy if isinstance(self.policy, ActionStream) else None
        if obs.episode_start:
            self._queue = []
            if stream is not None:
                stream.reset()
        try:
            if stream is not None:
                t0 = self.clock()
                out, raw = None, np.asarray(stream.next_action(lambda: self._feed(obs), self.ticks))
                self.infer_ms.append((self.clock() - t0) * 1e3)
            elif self.chunk and self._queue:
                out, raw = None, self._queue.pop(0)
            else:
                feed = self._feed(obs)
                t0 = self.clock()
                out = cast(Callable[[dict], list], self.policy)(feed)
                self.infer_ms.append((self.clock() - t0) * 1e3)
                raw = np.asarray(out[0])[0]
                if self.chunk:  # [H,A]: send the first, keep the next execute_steps - 1
                    self._queue = list(raw[1: self.execute])
                    raw = raw[0]
        except PolicyUnavailable as e:
            return self._hold(e, start)
        except PolicyRefused as e:
            self._safe_stop(f"policy refused: {e}")
            return False
        if self._outage_since is not None:
            print(f"ctrl-rl deploy: the policy answers again at tick {self.ticks}, after "
                  f"{self.clock() - self._outage_since:.2f} s", file=sys.stderr, flush=True)
            self._outage_since = None
        if self.discrete:
            n = self.meta["action"]["n"]
            ok = np.isfinite(raw).all() and 0 <= int(raw) < n
            command, reasons = (np.asarray(int(raw)), []) if ok else (np.asarray(0), ["bounds"])
        else:
            assert self.safety is not None  # deploy_sim gives every continuous policy a safety filter
            command, reasons = self.safety.filter(raw, obs.state)
        for r in reasons:
            if r not in self._seen:
                self._seen.add(r)
                print(f"ctrl-rl deploy: safety filter: {r} at tick {self.ticks} (proposed {np.asarray(raw).tolist()}, "
                      f"sent {np.asarray(command).tolist()}); later ones are counted", file=sys.stderr, flush=True)
        self.robot.send(command)
        if self.recurrent:
            assert out is not None  # a recurrent export is never a chunk policy: it runs every tick
            self._hidden = np.asarray(out[1], dtype=np.float32)
            self._prev_a = np.asarray(command, dtype=np.float32).reshape(self._prev_a.shape)
        end = self.clock()
        self.tick_ms.append((end - start) * 1e3)
        if self._log is not None:
            self._log.write(json.dumps({"tick": self.ticks, "t": start, "proposed": np.asarray(raw).tolist(),
                                        "sent": np.asarray(command).tolist(), "reasons": reasons,
                                        "infer_ms": self.infer_ms[-1] if out is not None else 0.0,
                                        "tick_ms": self.tick_ms[-1]}) + "\n")
        self.ticks += 1
        return self._wait(end)

    def _hold(self, e: PolicyUnavailable, start: float) -> bool:
        """A tick without a policy action: the safe action, logged; a late answer is a missed deadline."""
        self.robot.stop()
        end = self.clock()
        self.held += 1
        self.late += e.late
        if self._outage_since is None:
            self._outage_since = start
            self.outages += 1
            print(f"ctrl-rl deploy: no action at tick {self.ticks} ({e}): commanding the safe action (robot.stop()) "
                  "until the policy answers", file=sys.stderr, flush=True)
        self.tick_ms.append((end - start) * 1e3)
        if self._log is not None:
            self._log.write(json.dumps({"tick": self.ticks, "t": start, "held": str(e), "late": e.late,
                                        "tick_ms": self.tick_ms[-1]}) + "\n")
        self.ticks += 1
        if end - self._outage_since > self.config.max_outage:
            self._safe_stop(f"no action from the policy for {end - self._outage_since:.1f} s > "
                            f"{self.config.max_outage} s")
            return False
        if not e.late and self.config.rate <= 0:
            self.sleep(0.01)  # as fast as possible, but no busy loop of probes while the policy is away
        return self._wait(end, miss=e.late, count=e.late)

    def _wait(self, end: float, miss: bool = False, count: bool = True) -> bool:
        """Sleep to the next deadline. A tick that ended after it, or had a late answer (``miss``), is a missed
        deadline, counted towards the watchdog unless ``count`` is False (a tick held while the policy is away)."""
        late = False
        if self.config.rate > 0:
            period = 1.0 / self.config.rate
            self._deadline = (self._deadline if self._deadline is not None else end) + period
            late = end > self._deadline
            if late:
                self._deadline = end  # re-anchor: no burst of catch-up ticks after a late one
            else:
                self.sleep(self._deadline - end)
        if not count:
            return True
        if late or miss:
            self.misses += 1
            self._missed_in_row += 1
            if self._missed_in_row >= self.config.max_misses:
                at = f" at {self.config.rate} Hz" if self.config.rate > 0 else " (late answers)"
                self._safe_stop(f"{self._missed_in_row} missed deadlines in a row{at}")
                return False
            return True
        self._missed_in_row = 0
        return True

    def start(self) -> None:
        """Anchor the first deadline one period from now."""
        self._deadline = self.clock()

    def stats(self) -> dict:
        def pct(x, q):
            return float(np.percentile(x, q)) if x else None

        out = {"ticks": self.ticks, "latency_ms": {"inference_p50": pct(self.infer_ms, 50),
                                                   "inference_p99": pct(self.infer_ms, 99),
                                                   "tick_p50": pct(self.tick_ms, 50),
                                                   "tick_p99": pct(self.tick_ms, 99)},
               "deadline_misses": self.misses, "safe_stop": self.stop_reason,
               "held_ticks": self.held, "outages": self.outages, "late_answers": self.late}
        if self.safety is not None:
            out["safety"] = self.safety.stats()
        return out

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


@dataclass(frozen=True)
class DeployOptions:
    sim: str = ""
    """Simulator env id to run the exported policy against (e.g. manip:Reach, Pendulum-v1)."""
    episodes: int = 3
    """Episodes to run."""
    rate: float | None = None
    """Control rate in Hz (default: the export's control rate, else 15); 0: as fast as possible."""
    seed: int = 0
    """Seed of the simulator."""
    max_steps: int = 100_000
    """Cap on control ticks in total."""
    max_step_change: float | None = None
    """Safety filter: largest change of a command component per tick (None: off)."""
    max_obs_age: float = 0.5
    """Watchdog: an observation older than this (s) is stale."""
    max_misses: int = 3
    """Watchdog: missed deadlines in a row before a safe stop."""
    log: str | None = None
    """Write every tick (proposed and sent command, filter reasons, latencies) to this JSONL file."""
    server: str | None = None
    """HOST:PORT of a `ctrl-rl serve` of this export: ask it for the actions instead of running the export here."""
    token: str | None = None
    """The server's shared token (default: $CTRL_RL_TOKEN, else none)."""
    timeout: float | None = None
    """With --server: an answer later than this (s) is not used, the tick holds (default: one control period; 1 s at
    --rate 0)."""
    ask_ahead: float = 0.5
    """With --server and a chunk export: ask for the next chunk when this fraction of a chunk's executed actions is
    left in the queue (LeRobot's chunk_size_threshold)."""
    max_outage: float = 30.0
    """With --server: how long (s) the server may be unreachable, at the start (then deploy gives up) or during the
    run (then a safe stop; until then every tick holds)."""

    def __post_init__(self) -> None:
        if not self.sim:
            raise UserInputError("ctrl-rl deploy needs --sim ENV_ID: expected the simulator task to run the export in "
                                 "(a real robot plugs in through ctrl_rl.deploy.runtime.RobotInterface)")
        if self.episodes < 1:
            raise UserInputError(f"invalid --episodes {self.episodes!r}: expected a positive integer")
        if self.max_steps < 1:
            raise UserInputError(f"invalid --max-steps {self.max_steps!r}: expected a positive integer")
        if self.timeout is not None and not (np.isfinite(self.timeout) and self.timeout > 0):
            raise UserInputError(f"invalid --timeout {self.timeout!r}: expected a positive number of seconds")
        if not 0 <= self.ask_ahead < 1:
            raise UserInputError(f"invalid --ask-ahead {self.ask_ahead!r}: expected a fraction in [0, 1)")
        if not self.max_outage > 0:
            raise UserInputError(f"invalid --max-outage {self.max_outage!r}: expected a positive number of seconds")


def deploy_sim(export_dir: str, opts: DeployOptions) -> dict[str, Any]:
    """Run an export against a simulator through the runtime (``ctrl-rl deploy``); returns the summary."""
    from ctrl_rl.deploy.sidecar import read_export

    meta = read_export(export_dir)
    if not opts.server and "onnx" not in meta["files"]:
        raise UserInputError(f"{export_dir!r} has no policy.onnx: expected an export made with --format onnx "
                             "(the runtime runs onnxruntime)")
    robot = SimRobot(opts.sim, opts.seed)
    client = None
    try:
        check_compatible(meta, robot.spec, robot.robot, opts.sim)
        rate = opts.rate if opts.rate is not None else (meta.get("control_hz") or 15.0)
        policy: Callable[[dict], list] | ActionStream
        remote_stats: Callable[[], dict] | None = None
        if opts.server:
            from ctrl_rl.deploy.client import RemoteChunks, RemotePolicy, connect

            sha = hashlib.sha256((Path(export_dir) / "policy.json").read_bytes()).hexdigest()
            client, _ = connect(opts.server, sha, opts.token, opts.max_outage)
            timeout = opts.timeout or (1.0 / rate if rate > 0 else 1.0)
            chunk = int(meta["action"].get("chunk") or 0)
            if chunk:
                chunks = RemoteChunks(client, sha, timeout, int(meta["action"].get("execute_steps") or chunk),
                                      opts.ask_ahead)
                policy, remote_stats = chunks, chunks.stats
            else:
                policy = RemotePolicy(client, sha, timeout)
        else:
            policy = OnnxPolicy(Path(export_dir) / meta["files"]["onnx"])
        safety = None
        if meta["action"]["kind"] != "discrete":
            hw = export_robot(meta) or robot.robot  # the export's robot, as a robot without the task reads it
            safety = SafetyFilter(action_space_of(meta, hw), hw,
                                  SafetyConfig(max_step_change=opts.max_step_change))
        prompter = Prompter(export_dir, meta["language"]) if meta.get("language") else None
        loop = ControlLoop(policy, meta, robot, safety,
                           LoopConfig(rate, opts.max_obs_age, opts.max_misses, opts.max_outage),
                           Path(opts.log) if opts.log else None, prompter=prompter)
        try:
            loop.start()
            while len(robot.episodes) < opts.episodes and loop.ticks < opts.max_steps and loop.tick():
                pass
            robot.stop()
        finally:
            loop.close()
        eps = robot.episodes
        succ = [e["success"] for e in eps if e["success"] is not None]
        return {"export": str(export_dir), "sim": opts.sim, "rate_hz": rate, "episodes": len(eps),
                "return_mean": float(np.mean([e["return"] for e in eps])) if eps else None,
                "length_mean": float(np.mean([e["length"] for e in eps])) if eps else None,
                "success_rate": float(np.mean(succ)) if succ else None, **loop.stats(),
                **({"server": {**client.stats(), **(remote_stats() if remote_stats else {})}} if client else {})}
    finally:
        robot.close()
        if client is not None:
            client.close()
