"""Scripted demonstrations of the manipulation tasks, recorded in the LeRobot v3.0 layout with DROID's key names.

``ctrl-rl data generate --env manip:Lift --level scripted --format lerobot [--episodes 50] [--noise 0.1]``
runs the task's scripted expert (``envs.manipulation.experts``) in ``--num-envs`` envs with the three cameras,
optionally with Gaussian noise on its actions, and writes every finished episode with
``storage.datasets.lerobot.LeRobotWriter``. Episodes that end without success are kept and marked
(``is_episode_successful`` false), so the data mix successes and failures as DROID does.

Per frame, in the LeRobot DROID port's vocabulary (``droid_features``):
- ``observation.state`` = joint positions (7) + gripper (1), and its parts ``observation.state.{joint_position,
  cartesian_position, gripper_position}``;
- ``observation.images.{exterior_1_left, exterior_2_left, wrist_left}`` from the env's cameras
  ``exterior_image_1_left``, ``exterior_image_2_left`` and ``wrist_image_left``;
- ``action.cartesian_velocity`` (6) and ``action.gripper_velocity`` (1): the command sent, in [-1, 1];
- ``action.gripper_position``: the gripper target after the command (``clip(target + 0.25 a, 0, 1)``, the env's
  gripper servo); ``action.joint_position`` and ``action.cartesian_position``: the joints and the pose reached
  (the next frame's); ``action.joint_velocity``: the joint motion of the step in DROID's normalised units
  (``dq / 0.2 rad``, clipped to [-1, 1]);
- ``action`` = ``action.joint_position`` + ``action.gripper_position`` (the port's 8-vector);
  ``action.original`` = cartesian velocity (6) + gripper position (RLDS's 7-vector);
- ``language_instruction{,_2,_3}``: the task's three phrasings, the episode's own first (also the frame's task);
- ``reward`` (the env's dense reward), ``discount`` (0 on a terminal step), ``is_first``, ``is_last``,
  ``is_terminal``, ``is_episode_successful``.

ctrl_rl adds two keys that DROID does not have: ``observation.environment_state``, the task's privileged state
(object and goal positions; LeRobot's name for it), and ``action.env``, the env's own 7-vector (cartesian
velocity + gripper velocity), so an agent of the simulator can be trained on the data directly. Episodes end at
the first success (the env's ``terminate_on_success``) or at the time limit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ctrl_rl.core.obs import Obs
from ctrl_rl.envs.manipulation.experts import expert_actions
from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.spec import DROID_CAMERA_NAMES

GRIPPER_STEP, JOINT_STEP = 0.25, 0.2


@dataclass(frozen=True)
class ScriptedOptions:
    env: str
    """A manipulation task id: manip:Reach, manip:Lift, manip:Push, manip:PickPlace or manip:OpenDrawer."""
    episodes: int = 50
    """Episodes to record (successful or not)."""
    noise: float = 0.0
    """Standard deviation of Gaussian noise added to the expert's actions (then clipped to [-1, 1])."""
    cameras: str = "all"
    """Cameras to record: all, none, or names joined by + (exterior1+wrist)."""
    image_size: str = "180x320"
    """H x W of the recorded images."""
    seed: int = 0
    num_envs: int = 4
    randomize: bool = False
    """The env's domain randomisation (colours, lights, cameras, friction, masses)."""
    out: str | None = None
    """Output directory (default: the dataset cache, ``<task>-scripted-lerobot``)."""
    force: bool = False
    mis_grasp: float = 0.0
    """Fraction of episodes in which the expert never closes the gripper (a systematic failure, e.g. to test
    learning from data that mixes successes and failures; the arm moves as the expert's)."""


def _task(env: str) -> str:
    if not env.startswith("manip:") or "," in env:
        raise UserInputError(f"--env {env!r} with --level scripted: expected a manipulation task id such as "
                             "manip:Lift (options come from the generate flags)")
    return env.split(":", 1)[1]


def features(task_priv_dim: int, cameras: tuple[str, ...], image_hw: tuple[int, int]) -> dict:
    from ctrl_rl.storage.datasets.lerobot import droid_features

    feats = droid_features(image_hw, tuple(DROID_CAMERA_NAMES[c] for c in cameras), metadata=False)
    feats["observation.environment_state"] = {"dtype": "float32", "shape": (task_priv_dim,), "names": None}
    feats["action.env"] = {"dtype": "float32", "shape": (7,), "names": {"axes": ["x", "y", "z", "roll", "pitch", "yaw",
                                                                                 "gripper"]}}
    return feats


def generate_scripted(opts: ScriptedOptions, progress: bool = True) -> dict:
    """Record ``opts.episodes`` expert episodes (module docstring); returns a summary of what was written."""
    from ctrl_rl.envs.manipulation.env import ManipEnv
    from ctrl_rl.storage.datasets.cache import data_dir
    from ctrl_rl.storage.datasets.lerobot import LeRobotWriter

    task = _task(opts.env)
    expected = {"noise": "non-negative number", "mis_grasp": "fraction in [0, 1]"}
    for name, ok in (("episodes", opts.episodes >= 1), ("num_envs", opts.num_envs >= 1),
                     ("noise", math.isfinite(opts.noise) and opts.noise >= 0),
                     ("mis_grasp", math.isfinite(opts.mis_grasp) and 0 <= opts.mis_grasp <= 1)):
        if not ok:
            raise UserInputError(f"invalid --{name.replace('_', '-')} {getattr(opts, name)!r}: expected a "
                                 f"{expected.get(name, 'positive integer')}")
    out = Path(opts.out) if opts.out else data_dir() / f"{task.lower()}-scripted-lerobot"
    if out.exists():
        if not opts.force:
            raise UserInputError(f"{out} already exists: expected a new --out directory, or --force to replace it")
    n = min(opts.num_envs, opts.episodes)
    env = ManipEnv(task, num_envs=n, seed=opts.seed, cameras=opts.cameras, image_size=opts.image_size,
                   language=True, terminate_on_success=True, randomize=opts.randomize)
    cams = tuple(p.name.split("/", 1)[1] for p in env.spec.parts if p.name.startswith("image/"))
    hw = env.config.image_size
    priv = env.spec.obs_dim - 14
    rng = np.random.default_rng(opts.seed)
    tmp_out = out.parent / f".{out.name}.replacing" if out.exists() else out
    writer = LeRobotWriter(tmp_out, fps=int(env.robot.control_hz), features=features(priv, cams, hw),
                           robot_type="Franka")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=opts.episodes, desc=f"scripted {task}", unit="episode")
    t0 = time.time()
    written, successes, frames = 0, 0, 0
    try:
        obs = _parts(env.reset(seed=opts.seed))
        episodes = [[] for _ in range(n)]  # per env: the frames of its current episode
        grip = np.zeros(n)  # the gripper target each env's servo holds
        instr = list(env.instructions)  # [N] the instruction of each env's current episode
        open_hand = rng.random(n) < opts.mis_grasp  # [N] episodes whose gripper is held open
        while written < opts.episodes:
            state = obs["state"].numpy()  # [N,O]
            a = expert_actions(task, state)  # [N,7]
            if opts.noise > 0:
                a = np.clip(a + rng.normal(0.0, opts.noise, a.shape), -1.0, 1.0).astype(np.float32)
            a[open_hand, 6] = -1.0  # a mis-grasp: the gripper never closes
            out_step = env.step(torch.as_tensor(a))
            grip = np.clip(grip + GRIPPER_STEP * a[:, 6], 0.0, 1.0)
            reached = _parts(out_step.final_obs)["state"].numpy()  # [N,O]: where each env got (before any reset)
            done = (out_step.terminated | out_step.truncated).numpy()
            success = out_step.info["success"].numpy().astype(bool)
            for i in range(n):
                images = {DROID_CAMERA_NAMES[c]: obs[f"image/{c}"][i].permute(1, 2, 0).numpy() for c in cams}
                episodes[i].append(_frame(state[i], reached[i], a[i], grip[i], images, float(out_step.reward[i]),
                                          bool(out_step.terminated[i]), bool(success[i])))
                if done[i]:
                    if written < opts.episodes:
                        ok = any(f["_success"] for f in episodes[i])
                        _write_episode(writer, episodes[i], env.task_instructions, instr[i], ok)
                        written += 1
                        successes += ok
                        frames += len(episodes[i])
                        if bar is not None:
                            bar.update(1)
                    episodes[i] = []
                    grip[i] = 0.0
                    instr[i] = env.instructions[i]
                    open_hand[i] = rng.random() < opts.mis_grasp
            obs = _parts(out_step.obs)
        writer.finalize()
    except BaseException:
        writer.abort()
        raise
    finally:
        env.close()
        if bar is not None:
            bar.close()
    if tmp_out != out:
        import shutil

        shutil.rmtree(out)
        tmp_out.rename(out)
    return {"path": str(out), "format": "lerobot", "task": task, "episodes": written, "frames": frames,
            "success_rate": successes / written, "cameras": [DROID_CAMERA_NAMES[c] for c in cams],
            "image_size": list(hw), "noise": opts.noise, "mis_grasp": opts.mis_grasp,
            "seconds": round(time.time() - t0, 1)}


def _parts(obs: Obs) -> dict[str, torch.Tensor]:
    """The env's observation as the dict of parts it is: the env has a language part, so never a plain tensor."""
    assert isinstance(obs, dict)
    return obs


def _droid_pose(pose: np.ndarray) -> np.ndarray:
    """The env's pose (roll in [0, 2 pi)) in DROID's convention (roll in (-pi, pi])."""
    out = pose.astype(np.float32).copy()
    out[3] = (out[3] + math.pi) % (2 * math.pi) - math.pi
    return out


def _frame(state, reached, a, grip, images, reward, terminal, success) -> dict:
    q, q_next = state[:7], reached[:7]
    return {
        "observation.state": np.concatenate([q, state[13:14]]).astype(np.float32),
        "observation.state.joint_position": q.astype(np.float32),
        "observation.state.cartesian_position": _droid_pose(state[7:13]),
        "observation.state.gripper_position": state[13:14].astype(np.float32),
        "observation.environment_state": state[14:].astype(np.float32),
        **{f"observation.images.{k}": v for k, v in images.items()},
        "action.cartesian_velocity": a[:6].astype(np.float32),
        "action.gripper_velocity": a[6:7].astype(np.float32),
        "action.gripper_position": np.array([grip], np.float32),
        "action.joint_position": q_next.astype(np.float32),
        "action.cartesian_position": _droid_pose(reached[7:13]),
        "action.joint_velocity": np.clip((q_next - q) / JOINT_STEP, -1, 1).astype(np.float32),
        "action": np.concatenate([q_next, [grip]]).astype(np.float32),
        "action.original": np.concatenate([a[:6], [grip]]).astype(np.float32),
        "action.env": a.astype(np.float32),
        "reward": np.array([reward], np.float32),
        "discount": np.array([0.0 if terminal else 1.0], np.float32),
        "is_terminal": np.array([terminal]),
        "_success": success,
    }


def _write_episode(writer, frames: list[dict], phrasings, instruction: str, success: bool) -> None:
    others = [p for p in phrasings if p != instruction]
    texts = [instruction, *others][:3]
    T = len(frames)
    for t, f in enumerate(frames):
        row = {k: v for k, v in f.items() if k != "_success"}
        row.update({"is_first": np.array([t == 0]), "is_last": np.array([t == T - 1]),
                    "is_episode_successful": np.array([success]),
                    "language_instruction": texts[0], "language_instruction_2": texts[1],
                    "language_instruction_3": texts[2]})
        writer.add_frame(row, task=instruction)
    writer.save_episode()
