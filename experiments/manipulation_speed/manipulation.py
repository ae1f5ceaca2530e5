"""Benchmark: manip: env-steps/s in-process vs over worker processes, with and without cameras, and the render cost
of one camera.

Rows (each env built afresh, ``reset`` and ``--warmup`` untimed steps first, then ``--state-steps`` or
``--camera-steps`` timed steps of uniform random actions on N envs; env-steps/s = N * steps / seconds, auto-resets
included):

  state        ``manip:<task>``, the flat state, N envs
  cams         ``manip:<task>,cameras=<cams>,image_size=<size>``: every step renders each camera of every env
               (plus the ``final_obs`` frames of envs whose episode ended)

each for ``workers=0`` (every env stepped in this process) and ``workers=K`` (``--workers``, one ``spawn`` process
per slice of envs; the parent only concatenates). Render cost: ``CameraRenderer.render`` of one camera at
``--image-size`` on a fixed scene, per camera, median of ``--renders`` calls after 3 untimed ones (shadows and
reflections off, EGL on Mesa's llvmpipe here).

    python experiments/manipulation_speed/manipulation.py [--task Lift] [--envs 4] [--state-steps 300] \
        [--camera-steps 10]
                                             [--warmup 3] [--workers 2] [--image-size 180x320] [--cameras all]
                                             [--renders 20]

Writes experiments/manipulation_speed/manipulation.json and .md and prints the table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import git_commit, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script


def _rate(env_id: str, n: int, steps: int, warmup: int) -> float:
    from ctrl_rl.envs.registry import make_env

    env = make_env(env_id, num_envs=n, seed=0)
    try:
        gen = torch.Generator().manual_seed(0)
        env.reset()
        a = lambda: torch.rand(n, env.spec.action_dim, generator=gen) * 2 - 1  # noqa: E731
        for _ in range(warmup):
            env.step(a())
        t0 = time.perf_counter()
        for _ in range(steps):
            env.step(a())
        return n * steps / (time.perf_counter() - t0)
    finally:
        env.close()


def _render_ms(task: str, size: tuple[int, int], repeats: int) -> dict[str, float]:
    import mujoco

    from ctrl_rl.envs.manipulation.render import CameraRenderer
    from ctrl_rl.envs.manipulation.scene import CAMERAS, build_model
    from ctrl_rl.robots.spec import franka_droid

    robot = franka_droid()
    model = build_model(task, robot)
    data = mujoco.MjData(model)
    data.qpos[:7] = robot.home
    mujoco.mj_forward(model, data)
    r = CameraRenderer(model, *size)
    out = {}
    try:
        for cam in CAMERAS:
            cid = model.camera(cam).id
            for _ in range(3):
                r.render(model, data, cid)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                r.render(model, data, cid)
                times.append(time.perf_counter() - t0)
            out[cam] = 1000 * statistics.median(times)
    finally:
        r.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="Lift")
    p.add_argument("--envs", type=int, default=4)
    p.add_argument("--state-steps", type=int, default=300, help="timed steps of the state-only rows")
    p.add_argument("--camera-steps", type=int, default=10, help="timed steps of the camera rows")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--image-size", default="180x320")
    p.add_argument("--cameras", default="all")
    p.add_argument("--renders", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    h, w = (int(x) for x in args.image_size.lower().split("x"))

    rows = []
    for label, opts in (("state", ""), ("cams", f",cameras={args.cameras},image_size={args.image_size}")):
        steps = args.state_steps if label == "state" else args.camera_steps
        for workers in (0, args.workers):
            env_id = f"manip:{args.task}{opts}" + (f",workers={workers}" if workers else "")
            sps = _rate(env_id, args.envs, steps, args.warmup)
            rows.append({"obs": label, "workers": workers, "envs": args.envs, "env_steps_per_s": sps})
            print(f"{label:6s} workers={workers}  {sps:8.1f} env-steps/s", flush=True)
    render = _render_ms(args.task, (h, w), args.renders)
    for cam, ms in render.items():
        print(f"render {cam:24s} {ms:6.1f} ms at {h}x{w}")

    host = f"{platform.node()}, {os.cpu_count()} CPUs, commit {git_commit()}"
    lines = [f"# manip: {args.task}, {args.envs} envs ({host})",
             "", "| observation | workers | env-steps/s |", "|---|---|---|"]
    lines += [f"| {r['obs']} | {r['workers'] or 'in-process'} | {r['env_steps_per_s']:.1f} |" for r in rows]
    lines += ["", f"| camera ({h}x{w}) | render ms |", "|---|---|"]
    lines += [f"| {cam} | {ms:.1f} |" for cam, ms in render.items()]
    md = "\n".join(lines) + "\n"
    print(md)
    write_result("manipulation", {"task": args.task, "envs": args.envs, "cameras": args.cameras,
                                  "image_size": [h, w], "rows": rows, "render_ms": render, "commit": git_commit()}, md,
                 folder=RESULTS)


if __name__ == "__main__":
    main()
