"""The deployment runtime: nothing unfiltered is sent, the watchdog stops on stale observations and missed
deadlines, a recurrent policy's state is carried and reset, and `ctrl-rl deploy` runs an export in a simulator."""

import json
import math

import numpy as np
import pytest

from ctrl_rl.cli import main
from ctrl_rl.deploy.runtime import ControlLoop, LoopConfig, Observation
from ctrl_rl.robots.safety import RobotState, SafetyFilter
from ctrl_rl.robots.spec import ActionSpace, franka_droid

META = {"inputs": [{"name": "state", "shape": ["batch", 2], "dtype": "float32"}],
        "action": {"kind": "continuous", "low": [-1.0, -1.0], "high": [1.0, 1.0]}}
SPACE = ActionSpace("env", (-1.0, -1.0), (1.0, 1.0), ("env", "env"))


class FakeRobot:
    def __init__(self, stamps=None, start_every=0, state=None):
        self.sent, self.stops, self.t = [], 0, 0
        self.stamps, self.start_every, self.state = stamps, start_every, state or RobotState()

    def observe(self):
        stamp = self.stamps[self.t] if self.stamps is not None else 0.0
        start = self.start_every and self.t % self.start_every == 0
        return Observation({"state": np.array([self.t, 0.0], np.float32)}, stamp, bool(start), self.state, 1.0)

    def send(self, command):
        self.sent.append(np.array(command))
        self.t += 1

    def stop(self):
        self.stops += 1


class Clock:
    def __init__(self, step=0.0):
        self.now, self.step = 0.0, step

    def __call__(self):
        self.now += self.step
        return self.now

    def sleep(self, s):
        self.now += s


def test_nan_and_out_of_range_actions_are_filtered_logged_and_never_sent(tmp_path, capsys):
    outputs = iter([[np.array([[0.5, 0.2]], np.float32)], [np.array([[math.nan, 0.0]], np.float32)],
                    [np.array([[7.0, -9.0]], np.float32)], [np.array([[math.inf, 0.1]], np.float32)]])
    robot = FakeRobot()
    log = tmp_path / "ticks.jsonl"
    loop = ControlLoop(lambda feed: next(outputs), META, robot, SafetyFilter(SPACE), LoopConfig(rate=0), log,
                       clock=Clock())
    for _ in range(4):
        assert loop.tick()
    loop.close()
    sent = np.stack(robot.sent)
    assert np.isfinite(sent).all() and (np.abs(sent) <= 1).all()
    assert np.array_equal(sent[1], sent[0])  # NaN: the last safe command held
    assert np.array_equal(sent[2], [1.0, -1.0]) and np.array_equal(sent[3], sent[2])
    stats = loop.stats()["safety"]
    assert stats["interventions/nonfinite"] == 2 and stats["interventions/bounds"] == 1
    err = capsys.readouterr().err
    assert "nonfinite at tick 1" in err and "bounds at tick 2" in err
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert rows[1]["reasons"] == ["nonfinite"] and rows[2]["sent"] == [1.0, -1.0]


def test_a_stale_observation_stops_the_robot_before_anything_is_sent():
    robot = FakeRobot(stamps=[0.0, 0.0])
    clock = Clock(step=0.3)  # the tick reads the clock at 0.3, 0.6, ...: the second observation is 0.6+ s old
    loop = ControlLoop(lambda feed: [np.zeros((1, 2), np.float32)], META, robot, SafetyFilter(SPACE),
                       LoopConfig(rate=0, max_obs_age=0.5), clock=clock)
    assert loop.tick()
    n = len(robot.sent)
    assert not loop.tick()
    assert robot.stops == 1 and len(robot.sent) == n and "stale" in loop.stats()["safe_stop"]


def test_missed_deadlines_in_a_row_stop_the_robot_and_a_punctual_tick_resets_the_count():
    clock = Clock()
    durations = iter([0.01, 0.2, 0.01, 0.2, 0.2, 0.2])  # the policy's inference time per tick at 10 Hz

    def slow_policy(feed):
        clock.now += next(durations)
        return [np.zeros((1, 2), np.float32)]

    robot = FakeRobot()
    robot.observe_orig = robot.observe
    robot.observe = lambda: Observation({"state": np.zeros(2, np.float32)}, clock.now, False, RobotState())
    loop = ControlLoop(slow_policy, META, robot, SafetyFilter(SPACE), LoopConfig(rate=10, max_misses=2),
                       clock=clock, sleep=clock.sleep)
    loop.start()
    assert [loop.tick() for _ in range(5)] == [True, True, True, True, False]
    assert loop.stats()["deadline_misses"] == 3 and robot.stops == 1 and "missed deadlines" in loop.stats()["safe_stop"]
    assert len(loop.tick_ms) == 5 and loop.stats()["latency_ms"]["inference_p99"] >= 190


def test_a_recurrent_policy_gets_its_hidden_state_back_and_zeros_at_each_episode_start():
    meta = {**META, "recurrent": {"prev_action": ["batch", 2], "prev_reward": ["batch"], "hidden": ["batch", 1, 3, 2]}}
    seen = []

    def policy(feed):
        seen.append({k: v.copy() for k, v in feed.items()})
        return [np.full((1, 2), 0.5, np.float32), feed["hidden"] + 1]

    robot = FakeRobot(start_every=3)
    loop = ControlLoop(policy, meta, robot, SafetyFilter(SPACE), LoopConfig(rate=0), clock=Clock())
    for _ in range(5):
        loop.tick()
    hidden = [float(s["hidden"].flat[0]) for s in seen]
    assert hidden == [0.0, 1.0, 2.0, 0.0, 1.0]  # episode starts at ticks 0 and 3
    assert [float(s["prev_reward"][0]) for s in seen] == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert np.array_equal(seen[1]["prev_action"], [[0.5, 0.5]]) and np.array_equal(seen[3]["prev_action"], [[0, 0]])


def test_the_loop_passes_the_robot_state_to_the_filter():
    robot_spec = franka_droid()
    p = np.array(robot_spec.workspace_high)  # at the box's corner: any step outwards is cut
    robot = FakeRobot(state=RobotState(ee_position=p))
    meta = {"inputs": META["inputs"], "action": {"kind": "continuous", "low": [-1.0] * 7, "high": [1.0] * 7}}
    loop = ControlLoop(lambda feed: [np.ones((1, 7), np.float32)], meta, robot,
                       SafetyFilter(robot_spec.action_space("cartesian_velocity"), robot_spec), LoopConfig(rate=0),
                       clock=Clock())
    loop.tick()
    assert np.array_equal(robot.sent[0][:3], [0, 0, 0]) and np.array_equal(robot.sent[0][3:], [1, 1, 1, 1])


SAC = ["--num-envs", "2", "--total-steps", "64", "--learning-starts", "32", "--batch-size", "16",
       "--actor-hidden", "16", "16", "--critic-hidden", "16", "16", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("deploy") / "sac"
    assert main(["train", "sac", "--env", "torch:Pendulum", "--run-dir", str(d), *SAC]) == 0
    assert main(["export", str(d), "--format", "onnx"]) == 0
    return d / "export"


def test_deploy_runs_the_export_in_the_simulator(export_dir, capsys, tmp_path):
    capsys.readouterr()
    log = tmp_path / "ticks.jsonl"
    assert main(["deploy", str(export_dir), "--sim", "torch:Pendulum", "--episodes", "2", "--rate", "0",
                 "--log", str(log)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["episodes"] == 2 and out["ticks"] == 400 and out["length_mean"] == 200.0
    assert out["latency_ms"]["inference_p50"] > 0 and out["deadline_misses"] == 0 and out["safe_stop"] is None
    assert out["safety"]["ticks"] == 400 and np.isfinite(out["return_mean"])
    assert len(log.read_text().splitlines()) == 400


def test_deploy_at_a_real_rate_keeps_its_deadlines(export_dir, capsys):
    capsys.readouterr()
    assert main(["deploy", str(export_dir), "--sim", "torch:Pendulum", "--episodes", "1", "--rate", "200",
                 "--max-steps", "40", "--max-misses", "40"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ticks"] == 40 and out["rate_hz"] == 200 and out["deadline_misses"] < 40


@pytest.mark.parametrize("args,needle", [
    (["--sim", "torch:CartPole"], "observation parts"),
    (["--sim", "torch:MountainCarContinuous"], "observation parts"),
    (["--episodes", "2"], "--sim"),
    (["--sim", "torch:Pendulum", "--rate", "-1"], "--rate"),
    (["--sim", "torch:Pendulum", "--episodes", "0"], "--episodes"),
])
def test_deploy_bad_input_is_one_sentence(export_dir, capsys, args, needle):
    capsys.readouterr()
    assert main(["deploy", str(export_dir), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err


def test_deploy_refuses_what_is_not_an_export_or_has_no_onnx(tmp_path, export_dir, capsys):
    assert main(["deploy", str(tmp_path), "--sim", "torch:Pendulum"]) == 2
    assert "policy.json" in capsys.readouterr().err
    meta = json.loads((export_dir / "policy.json").read_text())
    other = tmp_path / "pt2only"
    other.mkdir()
    (other / "policy.json").write_text(json.dumps({**meta, "files": {"pt2": "policy.pt2"}}))
    assert main(["deploy", str(other), "--sim", "torch:Pendulum"]) == 2
    assert "no policy.onnx" in capsys.readouterr().err
