"""`ctrl-rl serve` and the robot side over loopback, with real server processes: answers equal the in-process
policy's, a call without the token or with a malformed or wrongly shaped observation is refused with its status and
one sentence while the server lives on, a killed server makes the robot hold at the next tick and the loop goes on
when a new server answers, a late answer is a missed deadline, and chunk exports are queued and asked ahead."""

import hashlib
import json
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from ctrl_rl.cli import main
from ctrl_rl.deploy import wire
from ctrl_rl.deploy.client import PolicyClient, RemoteChunks, RemotePolicy, connect
from ctrl_rl.deploy.runtime import ControlLoop, DeployOptions, LoopConfig, Observation, OnnxPolicy, SimRobot
from ctrl_rl.deploy.server import PolicyServer, ServeOptions
from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.safety import SafetyFilter
from ctrl_rl.robots.spec import ActionSpace

TOKEN = "s3cret-token"
SAC = ["--num-envs", "2", "--total-steps", "64", "--learning-starts", "32", "--batch-size", "16",
       "--actor-hidden", "16", "16", "--critic-hidden", "16", "16", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("serve") / "sac"
    assert main(["train", "sac", "--env", "torch:Pendulum", "--run-dir", str(d), *SAC]) == 0
    assert main(["export", str(d), "--format", "onnx"]) == 0
    return d / "export"


def start_server(export: Path, log: Path, *args: str, port: int = 0) -> tuple[subprocess.Popen, str]:
    """`python -m ctrl_rl serve` in a process of its own; its address once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "ctrl_rl", "serve", str(export), "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=open(log, "a"), text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        pytest.fail(f"the server did not start: {log.read_text()}")
    return proc, json.loads(line)["address"]


@pytest.fixture(scope="module")
def served(export_dir, tmp_path_factory):
    """A server with a token, shared by the tests that do not kill it."""
    log = tmp_path_factory.mktemp("serve-log") / "stderr.txt"
    proc, address = start_server(export_dir, log, "--token", TOKEN)
    yield proc, address, log
    proc.terminate()
    assert proc.wait(30) == 0  # SIGTERM: a clean stop
    assert "ctrl-rl serve: stopped" in log.read_text()


def feed(batch=1, rows=None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"state": rng.normal(size=(batch, 3)).astype(np.float32) if rows is None else rows}


def sha(export: Path) -> str:
    return hashlib.sha256((export / "policy.json").read_bytes()).hexdigest()


def test_the_server_answers_what_the_export_answers_in_process(served, export_dir):
    _, address, _ = served
    client = PolicyClient(address, TOKEN)
    try:
        info = client.info(30, wait_for_ready=True)
        assert info.export_sha256 == sha(export_dir) and info.max_batch == 8
        assert json.loads(info.policy_json)["env"] == "torch:Pendulum"
        local = OnnxPolicy(export_dir / "policy.onnx")
        for batch in (1, 3):
            got, want = client.act(feed(batch), 10), local(feed(batch))
            assert len(got) == 1 and got[0].dtype == np.float32 and np.array_equal(got[0], want[0])
    finally:
        client.close()


def raw_act(address: str, body: bytes, token: str | None = TOKEN):
    channel = grpc.insecure_channel(address)
    try:
        call = channel.unary_unary("/ctrl_rl.policy.v1.Policy/Act")
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        return call(body, timeout=10, metadata=metadata, wait_for_ready=True)
    finally:
        channel.close()


def act_bytes(**inputs) -> bytes:
    return wire.encode(wire.ActRequest([wire.to_tensor(n, a) for n, a in inputs.items()]))


GOOD = act_bytes(state=np.zeros((1, 3), np.float32))


@pytest.mark.parametrize("token", [None, "wrong", TOKEN + " "])
def test_a_call_without_the_token_is_refused(served, token):
    _, address, _ = served
    with pytest.raises(grpc.RpcError) as e:
        raw_act(address, GOOD, token)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "token" in e.value.details()


def dup(body: bytes) -> bytes:
    return body + body  # the state tensor twice (repeated field)


BAD = {
    "not a message": (b"\xff\xff\xff", "is not an ActRequest"),
    "wrong dtype": (act_bytes(state=np.zeros((1, 3), np.float64)), "dtype float64: expected float32"),
    "wrong shape": (act_bytes(state=np.zeros((1, 4), np.float32)), "shape [1, 4]: expected [B, 3]"),
    "no batch dim": (act_bytes(state=np.zeros(3, np.float32)), "shape [3]: expected [B, 3]"),
    "batch too big": (act_bytes(state=np.zeros((9, 3), np.float32)), "batch is 9: expected 1 to 8"),
    "empty batch": (act_bytes(state=np.zeros((0, 3), np.float32)), "batch is 0"),
    "missing input": (act_bytes(), "lacks the input 'state'"),
    "unknown input": (act_bytes(state=np.zeros((1, 3), np.float32), image=np.zeros((1, 2), np.uint8)),
                      "input 'image' the export does not take"),
    "twice": (dup(GOOD), "'state' twice"),
    "short data": (wire.encode(wire.ActRequest([wire.Tensor("state", "float32", [1, 3], b"\0" * 11)])),
                   "has 11 bytes of data: expected 12"),
    "odd dtype": (wire.encode(wire.ActRequest([wire.Tensor("state", "complex64", [1, 3], b"")])), "'complex64'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_or_wrongly_shaped_observation_is_refused_in_one_sentence(served, case):
    proc, address, _ = served
    body, needle = BAD[case]
    with pytest.raises(grpc.RpcError) as e:
        raw_act(address, body)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = e.value.details()
    assert needle in details and "expected" in details and "\n" not in details
    assert proc.poll() is None and wire.decode(wire.ActResponse, raw_act(address, GOOD)).outputs  # still serving


def test_an_oversized_request_is_refused_before_it_is_read(served):
    proc, address, log = served
    with pytest.raises(grpc.RpcError) as e:
        raw_act(address, b"\0" * (1 << 20))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert proc.poll() is None and raw_act(address, GOOD)


def test_deploy_through_the_server_runs_the_same_episode_as_in_process(served, export_dir, capsys):
    _, address, _ = served
    run = ["deploy", str(export_dir), "--sim", "torch:Pendulum", "--episodes", "1", "--rate", "0"]
    assert main(run) == 0
    local = json.loads(capsys.readouterr().out)
    assert main([*run, "--server", address, "--token", TOKEN]) == 0, capsys.readouterr().err
    remote = json.loads(capsys.readouterr().out)
    assert remote["return_mean"] == local["return_mean"] and remote["ticks"] == local["ticks"] == 200
    assert remote["server"]["calls"] == 200 and remote["held_ticks"] == 0 and remote["safe_stop"] is None


def test_deploy_refuses_a_wrong_token_another_export_or_no_server(served, export_dir, tmp_path, capsys):
    _, address, _ = served
    other = tmp_path / "other"
    shutil.copytree(export_dir, other)
    meta = json.loads((other / "policy.json").read_text())
    (other / "policy.json").write_text(json.dumps({**meta, "note": "retrained"}))
    free = PolicyServer(export_dir, ServeOptions(port=0))  # a port nobody listens on once it stopped
    free.start()
    port = free.port
    free.stop(0)
    for args, needle in [([str(export_dir), "--server", address, "--token", "nope"], "refused the call"),
                         ([str(other), "--server", address, "--token", TOKEN], "serves another export"),
                         ([str(export_dir), "--server", f"127.0.0.1:{port}", "--max-outage", "0.5"],
                          "no policy server answered"),
                         ([str(export_dir), "--server", "localhost"], "expected HOST:PORT")]:
        capsys.readouterr()
        assert main(["deploy", *args, "--sim", "torch:Pendulum", "--episodes", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and err.count("\n") == 0, err


def test_a_killed_server_makes_the_robot_hold_at_the_next_tick_and_the_loop_reconnects(export_dir, tmp_path, capsys):
    log = tmp_path / "server.txt"
    proc, address = start_server(export_dir, log)
    port = int(address.rsplit(":", 1)[1])
    client, _ = connect(address, sha(export_dir), None)
    robot = SimRobot("torch:Pendulum")
    space = ActionSpace("env", (-2.0,), (2.0,), ("env",))
    ticks = tmp_path / "ticks.jsonl"
    # the watchdog's deadlines and the outage limit are not what this test checks: on a loaded machine (the suite
    # runs in two processes beside the server's) three late 20 ms ticks in a row would stop the loop before the
    # kill, and the restarted server can take longer than the default 30 s outage to import and listen
    loop = ControlLoop(RemotePolicy(client, sha(export_dir), timeout=10.0), json.loads(
        (export_dir / "policy.json").read_text()), robot, SafetyFilter(space),
        LoopConfig(rate=50, max_misses=10**6, max_obs_age=60.0, max_outage=180.0), ticks)
    try:
        loop.start()
        for _ in range(10):
            assert loop.tick()
        assert robot._len == 10 and robot.stopped == 0
        proc.kill()
        proc.wait()
        assert loop.tick()  # the first tick after the kill: the safe action, nothing sent
        assert robot.stopped == 1 and robot._len == 10 and loop.held == 1
        assert "commanding the safe action" in capsys.readouterr().err
        proc, _ = start_server(export_dir, log, port=port)  # the same port
        end = time.monotonic() + 60
        while robot._len == 10 and time.monotonic() < end:  # held until it answers
            assert loop.tick()
        # four more steps; on a loaded machine a tick can hold on a late answer (the watchdog's job, counted as
        # another outage), so the ticks are bounded rather than exactly four (it once took five, 2026-11-27)
        held = loop.held
        for _ in range(40):
            if robot._len == 15:
                break
            assert loop.tick()
        assert robot._len == 15 and loop.stats()["safe_stop"] is None
        assert loop.outages <= 1 + (loop.held - held), (loop.outages, loop.held - held)  # the kill: one outage
        assert re.search(r"answers again at tick \d+, after [\d.]+ s", capsys.readouterr().err)
    finally:
        loop.close()
        robot.close()
        client.close()
        proc.kill()
        proc.wait()
    rows = [json.loads(x) for x in ticks.read_text().splitlines()]
    assert "held" not in rows[9] and "unreachable" in rows[10]["held"] and "held" not in rows[-1]


class Slow:
    """The export's policy, late on the calls numbered in ``late`` (by ``delay`` seconds)."""

    def __init__(self, export: Path, late: set[int], delay: float):
        self.policy, self.late, self.delay, self.calls = OnnxPolicy(export / "policy.onnx"), late, delay, 0

    def __call__(self, feed):
        self.calls += 1
        if self.calls - 1 in self.late:  # call 0 is the server's warm-up
            time.sleep(self.delay)
        return self.policy(feed)


def test_a_late_answer_holds_the_robot_and_counts_as_a_missed_deadline(export_dir):
    server = PolicyServer(export_dir, ServeOptions(port=0, workers=4), policy=Slow(export_dir, {3, 5, 6, 7}, 0.3))
    server.start()
    client, _ = connect(f"127.0.0.1:{server.port}", sha(export_dir), None)
    robot = SimRobot("torch:Pendulum")
    loop = ControlLoop(RemotePolicy(client, sha(export_dir), timeout=0.1), json.loads(
        (export_dir / "policy.json").read_text()), robot, SafetyFilter(ActionSpace("env", (-2.0,), (2.0,), ("env",))),
        LoopConfig(rate=5, max_misses=3))
    try:
        loop.start()
        assert [loop.tick() for _ in range(7)] == [True] * 6 + [False]
        stats = loop.stats()
        assert stats["late_answers"] == 4 and robot.stopped == 5  # 4 ticks held, then the watchdog's safe stop
        assert stats["deadline_misses"] >= 4 and "3 missed deadlines in a row" in stats["safe_stop"]
        assert robot._len == 3  # ticks 0, 1, 3 sent
    finally:
        loop.close()
        robot.close()
        client.close()
        server.stop(0)


CHUNK_META = {"format": "ctrl_rl.export", "format_version": 1, "outputs": ["action"], "files": {},
              "inputs": [{"name": "state", "part": "state", "shape": ["batch", 3], "dtype": "float32"}],
              "action": {"kind": "continuous", "shape": ["batch", 4, 1], "chunk": 4, "execute_steps": 4,
                         "low": [-100.0], "high": [100.0]}}


class TickRobot:
    """Observes the tick number as its state; an episode starts every ``episode`` ticks."""

    def __init__(self, episode: int):
        self.sent, self.stops, self.t, self.episode = [], 0, 0, episode

    def observe(self):
        return Observation({"state": np.array([self.t, 0, 0], np.float32)}, time.monotonic(),
                           self.t % self.episode == 0)

    def send(self, command):
        self.sent.append(float(np.asarray(command)[0]))
        self.t += 1

    def stop(self):
        self.stops += 1


def test_a_chunk_export_runs_each_tick_s_action_and_asks_before_the_queue_runs_dry(tmp_path):
    export = tmp_path / "chunk"
    export.mkdir()
    (export / "policy.json").write_text(json.dumps(CHUNK_META))

    def chunk_policy(f):  # the chunk asked at tick t: actions t, t+1, t+2, t+3
        return [f["state"][:, :1, None] + np.arange(4, dtype=np.float32)[None, :, None]]

    server = PolicyServer(export, ServeOptions(port=0), policy=chunk_policy)
    server.start()
    client, _ = connect(f"127.0.0.1:{server.port}", sha(export), None)
    chunks = RemoteChunks(client, sha(export), timeout=2.0, execute_steps=4, ask_ahead=0.5)
    robot = TickRobot(episode=30)
    space = ActionSpace("env", (-100.0,), (100.0,), ("env",))
    loop = ControlLoop(chunks, CHUNK_META, robot, SafetyFilter(space), LoopConfig(rate=20))
    try:
        loop.start()
        for _ in range(40):
            assert loop.tick()
        # every tick ran the action for itself: the queue is aligned to the tick each chunk was asked at
        assert robot.sent == [float(t) for t in range(40)]
        stats = chunks.stats()
        # it waited at the two episode starts (ticks 0 and 30); any other wait is an answer slower than a tick
        assert stats["ask_at"] == 2 and 2 <= stats["waited"] <= 4
        assert stats["chunks"] < 25 and stats["actions_replaced"] > 0  # asked ahead, overlapping the old chunk
        assert robot.stops == 0 and loop.held == 0
        server.stop(0)  # the queue still holds actions: none of them may run
        time.sleep(0.2)
        assert loop.tick() and robot.stops == 1 and len(robot.sent) == 40 and not chunks.queue
    finally:
        loop.close()
        client.close()
        server.stop(0)


def test_the_server_checks_a_recurrent_export_s_state_inputs(tmp_path):
    export = tmp_path / "rec"
    export.mkdir()
    meta = {**CHUNK_META, "outputs": ["action", "next_hidden"],
            "inputs": [{"name": "state", "part": "state", "shape": ["batch", 3], "dtype": "float32"},
                       {"name": "image.top", "part": "image/top", "shape": ["batch", 3, 4, 4], "dtype": "uint8"}],
            "action": {"kind": "continuous", "shape": ["batch", 1], "low": [-1.0], "high": [1.0]},
            "recurrent": {"prev_action": ["batch", 1], "prev_reward": ["batch"], "hidden": ["batch", 2, 5]}}
    (export / "policy.json").write_text(json.dumps(meta))
    server = PolicyServer(export, policy=lambda f: [np.zeros((len(f["state"]), 1), np.float32), f["hidden"] + 1])
    assert set(server.inputs) == {"state", "image.top", "prev_action", "prev_reward", "hidden"}
    good = {"state": np.zeros((2, 3), np.float32), "image.top": np.zeros((2, 3, 4, 4), np.uint8),
            "prev_action": np.zeros((2, 1), np.float32), "prev_reward": np.zeros(2, np.float32),
            "hidden": np.zeros((2, 2, 5), np.float32)}
    req = wire.ActRequest([wire.to_tensor(n, a) for n, a in good.items()])
    assert sorted(server.check(req)) == sorted(good)
    out = wire.decode(wire.ActResponse, server._act(wire.encode(req)))
    assert [t.name for t in out.outputs] == ["action", "next_hidden"] and wire.to_array(out.outputs[1]).max() == 1
    for name, bad, needle in [("prev_reward", np.zeros((2, 1), np.float32), "expected [B] with"),
                              ("hidden", np.zeros((3, 2, 5), np.float32), "batch 3 and another input 2"),
                              ("image.top", np.zeros((2, 3, 4, 4), np.float32), "expected uint8")]:
        req = wire.ActRequest([wire.to_tensor(n, bad if n == name else a) for n, a in good.items()])
        with pytest.raises(Exception, match=re.escape(needle)):
            server.check(req)


def test_serving_binds_loopback_warns_without_a_token_elsewhere_and_refuses_a_taken_port(export_dir, capsys):
    assert ServeOptions().host == "127.0.0.1"
    a = PolicyServer(export_dir, ServeOptions(port=0))
    a.start()
    try:
        with pytest.raises(UserInputError, match="cannot listen on 127.0.0.1"):
            PolicyServer(export_dir, ServeOptions(port=a.port)).start()
        b = PolicyServer(export_dir, ServeOptions(host="0.0.0.0", port=0))
        b.start()
        b.stop(0)
        assert "without a token" in capsys.readouterr().err
    finally:
        a.stop(0)
    for args, needle in [(["--port", "70000"], "--port"), (["--max-batch", "0"], "--max-batch"),
                         (["--hots", "x"], "--host")]:
        assert main(["serve", str(export_dir), *args]) == 2
        assert needle in capsys.readouterr().err


def test_deploy_options_refuse_bad_server_settings():
    for kw, needle in [({"timeout": 0.0}, "--timeout"), ({"ask_ahead": 1.0}, "--ask-ahead")]:
        with pytest.raises(UserInputError, match=needle):
            DeployOptions(sim="torch:Pendulum", **kw)
    with pytest.raises(UserInputError, match="--max-outage"):
        LoopConfig(max_outage=0)
