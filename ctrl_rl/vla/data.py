"""Demonstrations in the LeRobot layout as the VLA algorithms read them: frames with camera images, the
instruction, proprioception, an action chunk and the episode's outcome.

Shape letters: S frames in all, K episodes, H chunk length, A action dim, P proprio dim, C critic-state dim.

``load_demos(path, ...)`` maps the dataset's keys onto the policy's inputs (the robot spec's names):

- cameras: the env's camera ``image/<cam>`` part is read from the video ``observation.images.<name>`` where
  ``<name>`` is the camera's LeRobot DROID-port name (``robots.spec.DROID_CAMERA_NAMES``: the env's
  ``exterior_image_1_left`` is the port's ``exterior_1_left``) or the camera's own name; frames are resized to the
  env's image size (bilinear, antialiased) and kept uint8 ``[S,3,h,w]``;
- proprioception: ``observation.state`` (DROID: 7 joint positions + gripper), or the keys of ``state_key``
  joined by + (e.g. ``observation.state+observation.environment_state`` for a privileged-state check), ``[S,P]``;
- actions: ``action_key``, else the env's own ``action.env`` when the dataset has it (ctrl_rl's scripted data),
  else the keys of DROID's port that hold the robot action space's vector (``storage.datasets.lerobot.robot``:
  ``action.cartesian_velocity`` + ``action.gripper_velocity`` for ``cartesian_velocity``, ...), else ``action`` for
  a dataset outside DROID's vocabulary; its width must be the env's action dimension;
- the chunk of frame t: the actions of frames ``t .. t+H-1`` of its episode, the last action repeated past the
  episode's end (the robot holds its final command);
- outcome: ``is_episode_successful`` (or the other keys ``storage.datasets.lerobot.episode_success`` reads),
  used by HABC's weighting (``vla.habc``); ``intervention`` / ``is_intervention`` when present marks frames a
  human executed;
- critic state (HABC's critics only): ``observation.state`` + ``observation.environment_state`` when present.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.spec import DROID_CAMERA_NAMES
from ctrl_rl.storage.datasets.lerobot import episode_success, read_lerobot
from ctrl_rl.storage.datasets.lerobot.robot import action_keys, given_keys

STATE_KEY = "observation.state"
ENV_STATE_KEY = "observation.environment_state"
INTERVENTION_KEYS = ("intervention", "is_intervention")
IMAGE_PREFIX = "observation.images."


@dataclass
class Demos:
    """Every frame of a demonstration set, ready for batching (CPU tensors)."""

    images: dict[str, torch.Tensor]  # "image/<cam>" -> uint8 [S,3,h,w]
    proprio: torch.Tensor  # [S,P] float32
    action: torch.Tensor  # [S,A] float32, env units
    chunk_rows: torch.Tensor  # [S,H] int64: rows of the chunk's actions
    task_index: torch.Tensor  # [S] int64 into ``instructions``
    instructions: list[str]
    episode: torch.Tensor  # [S] int64
    steps_to_end: torch.Tensor  # [S] int64: frames left in the episode after this one
    next_row: torch.Tensor  # [S] int64: the next frame of the episode (its own row on the last frame)
    last: torch.Tensor  # [S] bool: the episode's last frame
    success: torch.Tensor | None  # [S] bool, the episode's outcome on each of its frames (None: no outcome)
    intervention: torch.Tensor  # [S] bool
    critic_state: torch.Tensor  # [S,C] float32
    action_key: str
    source: str

    @property
    def num_frames(self) -> int:
        return int(self.action.shape[0])

    def batch(self, rows: torch.Tensor) -> dict:
        """The frames ``rows`` [B] as a training batch: images, proprio, chunk ``[B,H,A]``, task indices into
        ``instructions`` (the dataset's, carried along), and what a sample weighting reads (critic states, episode
        ends, outcomes, interventions)."""
        nxt = self.next_row[rows]  # [B]
        out = {"images": {k: v[rows] for k, v in self.images.items()}, "proprio": self.proprio[rows],
               "chunk": self.action[self.chunk_rows[rows]], "task_index": self.task_index[rows],
               "instructions": self.instructions,
               "critic_state": self.critic_state[rows], "next_critic_state": self.critic_state[nxt],
               "last": self.last[rows], "steps_to_end": self.steps_to_end[rows],
               "intervention": self.intervention[rows]}
        if self.success is not None:
            out["success"] = self.success[rows]
        return out

    def sample(self, n: int, gen: torch.Generator, device: torch.device) -> dict:
        """``n`` frames drawn uniformly with ``gen`` as a batch on ``device``."""
        rows = torch.randint(0, self.num_frames, (n,), generator=gen, device=gen.device).cpu()  # [n]
        return to_device(self.batch(rows), device)


def to_device(batch: dict, device: torch.device) -> dict:
    """A batch's tensors (and those of its nested dicts) on ``device``; other values as they are."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else to_device(v, device) if isinstance(v, dict) else v
            for k, v in batch.items()}


def split_rows(batch: dict, parts: int) -> list[dict]:
    """A batch of ``parts * B`` rows as ``parts`` batches of B rows (tensors and nested dicts split along rows;
    other values, such as the instructions, shared)."""
    def part(v, i: int):
        if isinstance(v, torch.Tensor):
            return v.unflatten(0, (parts, -1))[i]  # [B,...] of [parts*B,...]
        return {k: part(x, i) for k, x in v.items()} if isinstance(v, dict) else v

    return [{k: part(v, i) for k, v in batch.items()} for i in range(parts)]


def _action_key(features: dict, given: str | None, action_space: str, width: int, source: str) -> list[str]:
    if given is not None:
        return given_keys(features, given, source)
    return action_keys(features, action_space, width, source)[0]


def _video_key(cam: str, video_keys: Sequence[str]) -> str | None:
    for name in (DROID_CAMERA_NAMES.get(cam), cam):
        if name and IMAGE_PREFIX + name in video_keys:
            return IMAGE_PREFIX + name
    return None


def load_demos(path: str | Path, cameras: Sequence[str], image_hw: tuple[int, int] | None, chunk: int, action_dim: int,
               action_space: str = "", action_key: str | None = None, episodes: Sequence[int] | None = None,
               state_key: str = STATE_KEY) -> Demos:
    """The demonstrations at ``path`` for a policy with ``cameras`` (env camera names), ``image_hw`` and actions of
    ``action_dim`` dims (``action_space`` is the robot spec's name of them). Errors name the input and what was
    expected."""
    data = read_lerobot(path)
    source = f"LeRobot dataset {data.root}"
    state_keys = state_key.split("+")
    for key in state_keys:
        if key not in data.features or data.features[key]["dtype"] in ("video", "string"):
            raise UserInputError(f"{source} has no numeric feature {key!r} for the proprioception: expected "
                                 f"{STATE_KEY!r} or --state-key naming the dataset's keys joined by +")
    keys = _action_key(data.features, action_key, action_space, action_dim, source)
    video = {}
    for cam in cameras:
        key = _video_key(cam, data.video_keys)
        if key is None:
            want = DROID_CAMERA_NAMES.get(cam, cam)
            raise UserInputError(f"{source} has no camera {want!r} (observation.images.{want}) that the model "
                                 f"expects: expected one of {data.video_keys or 'its videos, but it has none'}")
        video[cam] = key
    chosen = list(range(data.num_episodes)) if episodes is None else list(episodes)
    ok = episode_success(data)
    cols = [STATE_KEY, *state_keys, *keys, "task_index"] + [k for k in (ENV_STATE_KEY, *INTERVENTION_KEYS)
                                                            if k in data.features]
    proprio, act, task, crit, inter, images = [], [], [], [], [], {c: [] for c in cameras}
    lengths = []
    for e in chosen:
        f = data.frames(e, [c for c in dict.fromkeys(cols) if c in data.features])
        T = len(f[state_keys[0]])
        lengths.append(T)
        state = f[STATE_KEY].reshape(T, -1).astype(np.float32) if STATE_KEY in f else np.zeros((T, 0), np.float32)
        proprio.append(np.concatenate([f[k].reshape(T, -1).astype(np.float32) for k in state_keys], 1))  # [T,P]
        act.append(np.concatenate([f[k].reshape(T, -1).astype(np.float32) for k in keys], 1))  # [T,A]
        task.append(f["task_index"].reshape(T).astype(np.int64) if "task_index" in f else np.zeros(T, np.int64))
        extra = [f[ENV_STATE_KEY].reshape(T, -1).astype(np.float32)] if ENV_STATE_KEY in f else []
        crit.append(np.concatenate([state, *extra], 1))  # [T,C]
        flag = next((f[k] for k in INTERVENTION_KEYS if k in f), None)
        inter.append(np.zeros(T, bool) if flag is None else flag.reshape(T) != 0)
        for cam, key in video.items():
            frames = torch.from_numpy(data.video_frames(key, e)).permute(0, 3, 1, 2)  # [T,3,H,W] uint8
            images[cam].append(_resize(frames, image_hw))
    A = act[0].shape[1]
    if A != action_dim:
        raise UserInputError(f"{source}: the actions {'+'.join(keys)!r} have {A} dims but the robot spec's "
                             f"{action_space or 'action'} space has {action_dim}: expected equal action dimensions "
                             "(choose the dataset's key with --action-key)")
    lengths_t = torch.tensor(lengths)  # [K]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths_t.cumsum(0)])  # [K+1]
    S = int(offsets[-1])
    episode = torch.repeat_interleave(torch.arange(len(chosen)), lengths_t)  # [S]
    end = offsets[1:][episode] - 1  # [S] last row of the frame's episode
    rows = torch.arange(S)
    chunk_rows = torch.minimum(rows[:, None] + torch.arange(chunk)[None], end[:, None])  # [S,H]
    success = None
    if ok is not None:
        success = torch.from_numpy(np.asarray(ok)[chosen]).bool()[episode]  # [S]
    return Demos(
        images={f"image/{c}": torch.cat(v) for c, v in images.items()},
        proprio=torch.from_numpy(np.concatenate(proprio)), action=torch.from_numpy(np.concatenate(act)),
        chunk_rows=chunk_rows, task_index=torch.from_numpy(np.concatenate(task)), instructions=list(data.tasks),
        episode=episode, steps_to_end=end - rows, next_row=torch.minimum(rows + 1, end), last=rows == end,
        success=success, intervention=torch.from_numpy(np.concatenate(inter)),
        critic_state=torch.from_numpy(np.concatenate(crit)), action_key="+".join(keys), source=source)


def _resize(frames: torch.Tensor, hw: tuple[int, int] | None) -> torch.Tensor:
    """uint8 [T,3,H,W] -> uint8 [T,3,h,w], in blocks so a long episode does not hold float copies of all frames."""
    if hw is None or tuple(frames.shape[-2:]) == tuple(hw):
        return frames.contiguous()
    out = []
    for block in frames.split(64):
        x = F.interpolate(block.float(), size=tuple(hw), mode="bilinear", antialias=True, align_corners=False)
        out.append(x.round().clamp(0, 255).to(torch.uint8))
    return torch.cat(out)
