"""Policy server round trip over loopback against the in-process runtime, p50 / p99 (issue 31, part 3).

Two exports, made here unless given (``--mlp DIR``, ``--vla DIR``):

- ``mlp``: SAC's actor at its default size (256x256 ReLU) on torch:Pendulum (3 observations, 1 action), trained for
  64 steps (latency does not depend on training) and exported to ONNX;
- ``vla``: the tiny VLA of the tests (``vla_bc``, regression head, chunks of 2, one 24x32 camera, a 12-token
  instruction) on ``manip:Reach``, trained on six scripted episodes for 4 steps and exported.

For each, at batch 1 with fixed random inputs of the export's shapes and dtypes:

- ``in-process``: ``OnnxPolicy`` (onnxruntime, one thread), what ``ctrl-rl deploy --sim`` calls each tick;
- ``server``: ``PolicyClient.act`` against ``python -m ctrl_rl serve EXPORT`` in its own process on 127.0.0.1
  (encode, gRPC over loopback, the server's checks and the same onnxruntime call, decode), and the server's own
  time per call (``server_ms``: decode, checks, inference, encode).

Every call is timed alone; ``--calls`` calls per repeat after ``--warmup``, the two sides alternating per repeat so
that load drifts hit both alike; each cell is the median over ``--repeats`` repeats of that repeat's percentile.

Then the VLA in the runtime's control loop at ``--rate`` Hz for ``--ticks`` ticks (a stand-in robot that hands out
the fixed inputs; no simulator, whose rendering would dominate): each tick's time without its wait, in-process
(``OnnxPolicy``: a call every ``execute_steps`` ticks, the queue between) and over a server with ``RemoteChunks``
asking ahead (``--ask-ahead 0.5``, the default) and not (0: ask only when the queue is empty). That server runs in a
thread of this process, so that its inference can be made ``--delays-ms`` slower, a stand-in for a real VLA's
inference time: asking ahead hides it from the ticks.

    python experiments/serve_latency/serve_latency.py [--calls 1000] [--repeats 5] [--mlp DIR] [--vla DIR]
    python experiments/serve_latency/serve_latency.py --combine RUN.json RUN.json ...   # the median over runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import ROOT, git_commit, time_calls_ns, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent

from ctrl_rl.cli import main as cli  # noqa: E402
from ctrl_rl.deploy.client import PolicyClient, RemoteChunks  # noqa: E402
from ctrl_rl.deploy.runtime import ControlLoop, LoopConfig, Observation, OnnxPolicy, action_space_of  # noqa: E402
from ctrl_rl.deploy.server import PolicyServer, ServeOptions  # noqa: E402
from ctrl_rl.robots.safety import SafetyFilter  # noqa: E402

SAC = ["--num-envs", "2", "--total-steps", "64", "--learning-starts", "32", "--batch-size", "16", "--threads", "1",
       "--no-progress"]
VLA_ENV = "manip:Reach,cameras=exterior1,image_size=24x32,language=true,max_episode_steps=15"
VLA = ["--head", "regression", "--chunk", "2", "--max-text-len", "12", "--lora-rank", "4", "--batch-size", "4",
       "--total-steps", "4", "--eval-episodes", "1", "--threads", "1", "--no-progress"]


def quiet(args: list[str]) -> None:
    """One `ctrl-rl` command in this process, its output dropped."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert cli(args) == 0, args


def make_exports(work: Path) -> dict[str, Path]:
    quiet(["train", "sac", "--env", "torch:Pendulum", "--run-dir", str(work / "sac"), *SAC])
    quiet(["export", str(work / "sac"), "--format", "onnx"])
    quiet(["data", "generate", "--env", "manip:Reach", "--level", "scripted", "--format", "lerobot", "--episodes",
           "6", "--noise", "0.6", "--cameras", "exterior1", "--image-size", "24x32", "--out", str(work / "demos"),
           "--no-progress"])
    quiet(["train", "vla_bc", "--env", VLA_ENV, "--dataset", str(work / "demos"), "--run-dir", str(work / "vla"), *VLA])
    quiet(["export", str(work / "vla"), "--format", "onnx"])
    return {"mlp": work / "sac" / "export", "vla": work / "vla" / "export"}


def feed_of(meta: dict) -> dict[str, np.ndarray]:
    """Fixed random batch-1 inputs of the export's shapes and dtypes (token ids below 100)."""
    rng = np.random.default_rng(0)
    out = {}
    for i in meta["inputs"]:
        shape, dtype = [1, *i["shape"][1:]], np.dtype(i["dtype"])
        if dtype == np.uint8:
            out[i["name"]] = rng.integers(0, 256, shape).astype(dtype)
        elif dtype.kind in "iu":
            out[i["name"]] = rng.integers(0, 100, shape).astype(dtype)
        else:
            out[i["name"]] = rng.normal(size=shape).astype(dtype)
    return out


def start_server(export: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "ctrl_rl", "serve", str(export), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        raise SystemExit(f"the server of {export} did not start")
    return proc, json.loads(line)["address"]


def measure(name: str, export: Path, calls: int, warmup: int, repeats: int) -> list[dict]:
    meta = json.loads((export / "policy.json").read_text())
    feed = feed_of(meta)
    local = OnnxPolicy(export / meta["files"]["onnx"])
    proc, address = start_server(export)
    client = PolicyClient(address)
    try:
        client.info(30, wait_for_ready=True)
        same = all(np.array_equal(a, b) for a, b in zip(client.act(feed, 10), local(feed)))
        sides = {"in-process": lambda: local(feed), "server": lambda: client.act(feed, 10)}
        for fn in sides.values():
            time_calls_ns(fn, warmup)
        stats: dict[str, list[tuple[float, float]]] = {k: [] for k in [*sides, "server_ms"]}
        for _ in range(repeats):
            for label, fn in sides.items():
                if label == "server":
                    client.server_ms.clear()
                t = time_calls_ns(fn, calls) / 1e6  # ms
                stats[label].append((float(np.percentile(t, 50)), float(np.percentile(t, 99))))
            s = np.asarray(client.server_ms)
            stats["server_ms"].append((float(np.percentile(s, 50)), float(np.percentile(s, 99))))
    finally:
        client.close()
        proc.terminate()
        proc.wait(30)
    rows = []
    for label, reps in stats.items():
        p50, p99 = float(np.median([r[0] for r in reps])), float(np.median([r[1] for r in reps]))
        rows.append({"policy": name, "path": label, "p50_ms": p50, "p99_ms": p99,
                     "repeats_p50_ms": [r[0] for r in reps], "repeats_p99_ms": [r[1] for r in reps],
                     "same_answer": same, "chunk": meta["action"].get("chunk"),
                     "inputs": {i["name"]: [i["shape"][1:], i["dtype"]] for i in meta["inputs"]}})
        print(f"{name:4s} {label:11s} p50 {p50:7.3f} ms  p99 {p99:7.3f} ms", flush=True)
    return rows


class FixedRobot:
    """Hands out the same inputs every tick; sends nowhere."""

    def __init__(self, parts: dict[str, np.ndarray]):
        self.parts = {k: v[0] for k, v in parts.items()}

    def observe(self) -> Observation:
        return Observation(self.parts, time.monotonic())

    def send(self, command) -> None:
        pass

    def stop(self) -> None:
        pass


class Delayed:
    """The export's onnxruntime call, then a sleep: a stand-in for a larger model's inference time."""

    def __init__(self, path: Path, delay_s: float):
        self.policy, self.delay_s = OnnxPolicy(path), delay_s

    def __call__(self, feed):
        out = self.policy(feed)
        time.sleep(self.delay_s)
        return out


def in_loop(export: Path, rate: float, ticks: int, delays_ms: list[float]) -> list[dict]:
    """The chunk policy's time inside each control tick: in-process, and over a server (in a thread of this
    process, its inference made ``delay`` ms slower) asking ahead or not."""
    import hashlib

    meta = json.loads((export / "policy.json").read_text())
    feed = feed_of(meta)
    sha = hashlib.sha256((export / "policy.json").read_bytes()).hexdigest()
    execute = int(meta["action"].get("execute_steps") or meta["action"]["chunk"])
    onnx = export / meta["files"]["onnx"]
    rows = []
    cases = [("in-process", 0.0, None)] + [(f"server +{d:g} ms, ask ahead {ask:g}", d, ask)
                                           for d in delays_ms for ask in (0.5, 0.0)]
    for label, delay, ask in cases:
        server = client = None
        if ask is None:
            policy = OnnxPolicy(onnx)
        else:
            server = PolicyServer(export, ServeOptions(port=0), policy=Delayed(onnx, delay / 1e3))
            server.start()
            client = PolicyClient(f"127.0.0.1:{server.port}")
            client.info(30, wait_for_ready=True)
            policy = RemoteChunks(client, sha, 1.0 / rate, execute, ask)
        try:
            loop = ControlLoop(policy, {**meta, "language": None}, FixedRobot(feed),
                               SafetyFilter(action_space_of(meta, None)), LoopConfig(rate=rate, max_misses=ticks))
            loop.start()
            for _ in range(ticks):
                loop.tick()
            st = loop.stats()
        finally:
            if client is not None:
                client.close()
            if server is not None:
                server.stop(0)
        tick_ms = np.asarray(loop.tick_ms)
        rows.append({"path": label, "delay_ms": delay, "ask_ahead": ask, "rate_hz": rate, "ticks": loop.ticks,
                     "tick_ms_p50": float(np.median(tick_ms)), "tick_ms_p99": float(np.percentile(tick_ms, 99)),
                     "deadline_misses": st["deadline_misses"], "held_ticks": st["held_ticks"],
                     **(policy.stats() if isinstance(policy, RemoteChunks) else {})})
        print(f"loop {label:28s} tick p50 {rows[-1]['tick_ms_p50']:6.2f} ms  p99 {rows[-1]['tick_ms_p99']:6.2f} ms  "
              f"misses {st['deadline_misses']}", flush=True)
    return rows


def combine(paths: list[str]) -> None:
    """``serve_latency_runs.{json,md}``: each cell's median over several runs' results, and every run's value."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    keys = ["p50_ms", "p99_ms"]
    cells: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run in runs:
        for r in run["rows"]:
            for k in keys:
                cells.setdefault((r["policy"], r["path"]), {}).setdefault(k, []).append(r[k])
        for r in run["loop"]:
            for k in ("tick_ms_p50", "tick_ms_p99", "deadline_misses", "waited"):
                if k in r:
                    cells.setdefault(("vla loop", r["path"]), {}).setdefault(k, []).append(r[k])
    lines = ["# Policy server latency: the median over runs", "",
             f"{len(runs)} runs of `serve_latency.py` (commits {sorted({r['commit'] for r in runs})}, load averages "
             f"at their ends {[round(r['loadavg_end'][0], 1) for r in runs]} on {runs[0]['cpus']} cores); each run's "
             "value is itself a median over its repeats.", "",
             "| policy | path | measure | median over runs | each run |", "|---|---|---|---|---|"]
    out = []
    for (policy, path), measures in cells.items():
        for k, values in measures.items():
            med = float(np.median(values))
            out.append({"policy": policy, "path": path, "measure": k, "median": med, "runs": values})
            lines.append(f"| {policy} | {path} | {k} | {med:.3f} | {', '.join(f'{v:.3f}' for v in values)} |")
    write_result("serve_latency_runs", {"runs": paths, "cells": out}, "\n".join(lines) + "\n", folder=RESULTS)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mlp", help="an existing MLP export (default: made here)")
    ap.add_argument("--vla", help="an existing VLA chunk export (default: made here)")
    ap.add_argument("--rate", type=float, default=30.0)
    ap.add_argument("--ticks", type=int, default=150)
    ap.add_argument("--delays-ms", type=float, nargs="+", default=[0.0, 20.0])
    ap.add_argument("--combine", nargs="+", metavar="RUN.json", help="only write the median over these runs")
    a = ap.parse_args(argv)
    if a.combine:
        combine(a.combine)
        return
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        exports = {"mlp": Path(a.mlp), "vla": Path(a.vla)} if a.mlp and a.vla else make_exports(Path(d))
        built = time.perf_counter() - t0
        rows = [r for name, export in exports.items() for r in measure(name, export, a.calls, a.warmup, a.repeats)]
        loop_rows = in_loop(exports["vla"], a.rate, a.ticks, a.delays_ms)
    load = os.getloadavg()
    lines = ["# Policy server round trip over loopback against the in-process runtime", "",
             f"`python experiments/serve_latency/serve_latency.py --calls {a.calls} --repeats {a.repeats}`: batch 1, "
             f"each cell the median over {a.repeats} repeats of that repeat's percentile over {a.calls} calls; load "
             f"average at the end {load[0]:.1f} on {os.cpu_count()} cores.", "",
             "| policy | path | p50 (ms) | p99 (ms) | p99 per repeat (ms) |", "|---|---|---|---|---|"]
    for r in rows:
        path = {"server_ms": "inside the server"}.get(r["path"], r["path"])
        lines.append(f"| {r['policy']} | {path} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                     + ", ".join(f"{x:.2f}" for x in r["repeats_p99_ms"]) + " |")
    for name in ("mlp", "vla"):
        by = {r["path"]: r for r in rows if r["policy"] == name}
        lines.append("")
        lines.append(f"{name}: the network adds {by['server']['p50_ms'] - by['in-process']['p50_ms']:.3f} ms at p50 "
                     f"({by['server']['p50_ms'] / by['in-process']['p50_ms']:.1f}x the in-process call); the server "
                     f"answers exactly what the in-process call does: {by['server']['same_answer']}.")
    lines += ["", f"The VLA in the control loop at {a.rate:g} Hz, {a.ticks} ticks (server in a thread of the "
              "benchmark, its inference made slower by the delay): the tick's time without its wait.", "",
              "| path | tick p50 (ms) | tick p99 (ms) | deadline misses | ticks that waited for a chunk | chunks |",
              "|---|---|---|---|---|---|"]
    for r in loop_rows:
        lines.append(f"| {r['path']} | {r['tick_ms_p50']:.2f} | {r['tick_ms_p99']:.2f} | {r['deadline_misses']} | "
                     f"{r.get('waited', '-')} | {r.get('chunks', '-')} |")
    write_result("serve_latency", {"calls": a.calls, "warmup": a.warmup, "repeats": a.repeats, "rows": rows,
                                   "loop": loop_rows, "rate_hz": a.rate, "ticks": a.ticks,
                                   "loadavg_end": load, "cpus": os.cpu_count(), "setup_s": built,
                                   "seconds": time.perf_counter() - t0, "commit": git_commit(),
                                   "python": platform.python_version()}, "\n".join(lines) + "\n", folder=RESULTS)


if __name__ == "__main__":
    main()
