"""Export a trained policy so it can leave Python: ONNX (onnxruntime) and ``torch.export`` ``.pt2``.

``export_run(RUN)`` rebuilds the algorithm from the run's checkpoint (``learn.evaluate.load_policy``), takes its
``exportable()`` module (the deterministic policy with the observation normaliser and image encoder inside) and
wraps it in ``ExportModule``, which adds what a robot needs and the training loop kept outside the agent:

- inputs in the env's own form: one tensor per observation part (``state`` float32 ``[B,O]``, ``image/<cam>``
  uint8 ``[B,3,H,W]``, ...), named after the part with ``/`` written as ``.`` (``image.wrist``); any batch size;
- the action rescaled from the agent's [-1, 1] to the env's bounds (``learn.runtime.build_env`` trains through
  ``ActionRescale``; unbounded dimensions pass through), or the argmax index (int64) of a discrete policy;
- a policy of action chunks (a VLA: ``exportable()`` has ``chunk``) returns ``[B,H,A]`` (``action.chunk`` and
  ``action.execute_steps`` in ``policy.json``: the runtime runs the first ``execute_steps`` of each chunk); one
  with an instruction (``language_input()``) takes the prompt's token ids as ``language`` and ships
  ``tokenizer.json`` with the prompt template under ``language`` in ``policy.json``;
- a recurrent policy (an agent with ``reset_state``: NeuBay) takes ``prev_action`` (env units, as last sent),
  ``prev_reward`` and ``hidden`` and returns ``(action, hidden)``; zeros start an episode.

Next to the graphs, ``policy.json`` says everything a deployment needs and the same JSON sits in the ONNX model's
``metadata_props`` under ``ctrl_rl``: observation parts (names, shapes, dtypes), action space (bounds, units),
control rate, the robot spec when the env has one, the training config, the source checkpoint's sha256 and step,
and the largest difference between onnxruntime and eager torch measured at export (``parity``). Its ``deploy``
block (``deploy_metadata``) holds what the robot side reads instead of building the task: joint names, default
joint positions, PD gains, the action's scale, offset and kind, the control rate and the observation layout
(inputs, units, the ``state`` part's named slices); its fields also sit flat in ``metadata_props``
(``joint_names``, ``default_joint_pos``, ``joint_stiffness``, ``joint_damping``, ``action_scale``,
``action_offset``, ``observation_names``, ..., comma-separated as mjlab writes them). The export is
written to a temporary directory and renamed into place: a failed export leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from ctrl_rl.core.obs import ObsPart
from ctrl_rl.core.protocols import ChunkPolicy, LanguagePolicy, Recurrent, RecurrentPolicy
from ctrl_rl.core.provenance import file_sha256
from ctrl_rl.deploy.sidecar import FORMAT_VERSION, onnx_session
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.envs.registry import spec_of
from ctrl_rl.errors import UserInputError

FORMATS = ("onnx", "pt2")
PARITY_TOL = 1e-5
"""Largest |onnxruntime - eager| allowed at export (d3rlpy tests its exports at the same tolerance)."""


def input_name(part: str) -> str:
    """The graph input of an observation part: ``image/wrist`` -> ``image.wrist`` (no ``/`` in ONNX names)."""
    return part.replace("/", ".")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class ExportModule(nn.Module):
    """The exported graph: env-form observation parts in, the env's action out (module docstring).

    ``forward(*parts)`` for a policy of the observation alone (parts in ``spec.parts`` order);
    ``forward(*parts, prev_action, prev_reward, hidden) -> (action, hidden)`` for a recurrent one.
    """

    # buffers of a continuous policy (register_buffer in __init__), [A] each
    finite: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor

    def __init__(self, policy: nn.Module, spec, recurrent: bool = False, env_spec=None):
        """``spec``: the agent's (observation parts, [-1, 1] actions); ``env_spec``: the env's own spec under the
        training wrappers, whose action bounds the graph's output is in (default ``spec``)."""
        super().__init__()
        self.policy, self.recurrent = policy, recurrent
        self.flat, self.discrete = spec.is_flat, spec.discrete
        self.part_names = [p.name for p in spec.parts]
        if not spec.discrete:
            bounds = env_spec or spec
            low = torch.tensor(bounds.action_low, dtype=torch.float32)  # [A]
            high = torch.tensor(bounds.action_high, dtype=torch.float32)  # [A]
            finite = torch.isfinite(low) & torch.isfinite(high)  # [A]
            # the inverse of ActionRescale: a in [-1, 1] -> low + (a + 1) / 2 * (high - low); unbounded: a itself
            self.register_buffer("finite", finite)
            self.register_buffer("scale", torch.where(finite, (high - low) / 2, torch.ones_like(low)))
            self.register_buffer("bias", torch.where(finite, (high + low) / 2, torch.zeros_like(low)))

    def _obs(self, parts: Sequence[torch.Tensor]):
        return parts[0] if self.flat else dict(zip(self.part_names, parts))

    def _to_env(self, a: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return a.long()
        clipped = torch.where(self.finite, a.clamp(-1.0, 1.0), a)  # [B,A]
        return clipped * self.scale + self.bias

    def _to_agent(self, a: torch.Tensor) -> torch.Tensor:
        return (a - self.bias) / self.scale  # [B,A]

    def forward(self, *inputs: torch.Tensor):
        if not self.recurrent:
            return self._to_env(self.policy(self._obs(inputs)))
        *parts, prev_action, prev_reward, hidden = inputs
        a, h = self.policy(self._obs(parts), self._to_agent(prev_action), prev_reward, hidden)
        return self._to_env(a), h


@dataclass(frozen=True)
class ExportOptions:
    format: tuple[Literal["onnx", "pt2"], ...] = FORMATS
    """Which artifacts to write: ``policy.onnx`` and/or ``policy.pt2``."""
    out: str | None = None
    """Output directory (default: ``RUN/export``); an existing export there is replaced."""
    batch: int = 2
    """Batch size of the example inputs (the graphs take any batch size; 2 keeps the batch dimension symbolic)."""
    seed: int = 0
    """Seed of the random example observations used for tracing and the parity check."""

    def __post_init__(self) -> None:
        fmts = tuple(self.format)
        bad = [f for f in fmts if f not in FORMATS]
        if not fmts or bad:
            raise UserInputError(f"invalid --format {bad or fmts!r}: expected one or more of {list(FORMATS)}")
        object.__setattr__(self, "format", fmts)
        if self.batch < 2:
            raise UserInputError(f"invalid --batch {self.batch!r}: expected an integer >= 2")


def example_inputs(spec, batch: int, gen: torch.Generator, recurrent_hidden: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, ...]:
    """Random env-form inputs of ``batch`` rows: normal floats, uint8 images, token ids below 100; a recurrent
    policy's ``prev_action`` inside ``spec``'s action bounds (the env's), ``prev_reward`` and ``hidden`` follow."""
    out = []
    for p in spec.parts:
        if p.dtype == torch.uint8:
            out.append(torch.randint(0, 256, (batch, *p.shape), generator=gen, dtype=torch.uint8))
        elif not p.dtype.is_floating_point:
            out.append(torch.randint(0, 100, (batch, *p.shape), generator=gen).to(p.dtype))
        else:
            out.append(torch.randn((batch, *p.shape), generator=gen).to(p.dtype))
    if recurrent_hidden is not None:
        low = torch.tensor(spec.action_low).clamp(-1e3, 1e3)
        high = torch.tensor(spec.action_high).clamp(-1e3, 1e3)
        u = torch.rand((batch, spec.action_dim), generator=gen)  # [B,A]
        out += [low + u * (high - low), torch.randn(batch, generator=gen),
                torch.randn((batch, *recurrent_hidden.shape[1:]), generator=gen) * 0.1]
    return tuple(out)


def _robot_and_units(spec: EnvSpec) -> tuple[dict | None, list[str], str | None]:
    """The env spec's robot (a task built on ``robots.spec``), its action units and the name of its action space
    among the robot's; else None, ``"env"`` per dimension (the env's own units, as its bounds) and None."""
    units = list(spec.action_units) or ["env"] * spec.action_dim
    return (spec.robot.to_dict() if spec.robot is not None else None), units, spec.action_space_name


LAYOUT_UNITS = {"joint_position": "rad", "joint_velocity": "rad/s", "ee_position": "m", "gripper_position": "1"}
"""Units of the ``state`` slices an env's ``robot_state_layout`` names (an unknown slice name: None)."""


def _observation_layout(spec: EnvSpec, env_spec: EnvSpec, names: Sequence[str]) -> list[dict]:
    """The graph's observation inputs (``spec``'s parts) with shapes, dtypes and units, and for the ``state`` part the
    named column ranges of ``env_spec.robot_state_layout`` (every ``(start, stop)`` field; empty ranges left out)."""
    layout = env_spec.robot_state_layout
    slices = []
    if layout is not None:
        for f in dataclasses.fields(layout):
            start, stop = getattr(layout, f.name)
            if stop > start:
                slices.append({"name": f.name, "start": int(start), "stop": int(stop),
                               "units": LAYOUT_UNITS.get(f.name)})
    out = []
    for n, p in zip(names, spec.parts):
        units = ("pixels, uint8 0..255, channels first (RGB)" if p.name.startswith("image/") and p.dtype == torch.uint8
                 else "token ids" if p.name == "language" else None)
        out.append({"name": n, "part": p.name, "shape": list(p.shape), "dtype": _dtype_name(p.dtype), "units": units,
                    **({"slices": slices} if p.name == "state" else {})})
    return out


def deploy_metadata(spec: EnvSpec, env_spec: EnvSpec, names: Sequence[str]) -> dict:
    """What the robot side needs besides the graph, as mjlab's and Isaac Lab's exporters attach it: the robot's
    joint names, default joint positions (its home pose) and PD gains (``joint_stiffness`` / ``joint_damping``, None
    where the robot spec has none), the action's scale and offset and how a command becomes a target (the robot
    action space's ``kind``: ``delta`` adds ``scale * a`` per step, ``absolute`` targets ``offset + scale * a``;
    None when the env's action is not exactly that space), the control rate and the observation layout (input
    names, part names, shapes, dtypes, units and the ``state`` part's named slices). Read back by
    ``deploy.runtime``; the same fields sit flat in the ONNX model's ``metadata_props`` (``ONNX_KEYS``)."""
    robot = env_spec.robot
    space = None
    if robot is not None and env_spec.action_space_name:
        space = next((a for a in robot.action_spaces if a.name == env_spec.action_space_name), None)
    exact = space is not None and space.dim == env_spec.action_dim
    return {
        "robot": robot.name if robot is not None else None,
        "joint_names": list(robot.joint_names) if robot is not None else None,
        "default_joint_pos": list(robot.home) if robot is not None else None,
        "joint_stiffness": list(robot.joint_stiffness) if robot is not None and robot.joint_stiffness else None,
        "joint_damping": list(robot.joint_damping) if robot is not None and robot.joint_damping else None,
        "action_space": env_spec.action_space_name,
        "action_kind": space.kind if space is not None and exact else None,
        "action_scale": list(space.scale) if space is not None and exact else None,
        "action_offset": list(space.target_offset) if space is not None and exact else None,
        "control_hz": (1.0 / env_spec.dt) if env_spec.dt > 0 else None,
        "observation": _observation_layout(spec, env_spec, names),
    }


ONNX_KEYS = ("joint_names", "default_joint_pos", "joint_stiffness", "joint_damping", "action_scale", "action_offset")
"""``deploy`` fields also written as flat ``metadata_props`` (comma-separated, as mjlab writes them)."""


def onnx_deploy_props(deploy: dict) -> dict[str, str]:
    """The flat ``metadata_props`` of ``deploy_metadata``: lists comma-separated (``"0.1,0.2"``; names as they are),
    an absent field as ``""``, the rest as JSON; ``parse_onnx_deploy_props`` reads them back."""
    out = {}
    for k in ONNX_KEYS:
        v = deploy.get(k)
        out[k] = "" if v is None else ",".join(str(x) if isinstance(x, str) else repr(float(x)) for x in v)
    out["observation_names"] = ",".join(o["name"] for o in deploy["observation"])
    for k in ("robot", "action_space", "action_kind", "control_hz"):
        out[k] = json.dumps(deploy.get(k))
    return out


def parse_onnx_deploy_props(props: dict[str, str]) -> dict:
    """The ``deploy`` fields of an ONNX model's ``metadata_props`` (``onnx_deploy_props``'s inverse, less the
    observation layout, which is whole in the ``ctrl_rl`` JSON)."""
    out: dict = {}
    for k in ONNX_KEYS:
        text = props.get(k, "")
        out[k] = (None if text == "" else text.split(",") if k == "joint_names"
                  else [float(x) for x in text.split(",")])
    for k in ("robot", "action_space", "action_kind", "control_hz"):
        out[k] = json.loads(props[k]) if k in props else None
    out["observation_names"] = props.get("observation_names", "").split(",")
    return out


def _json_default(x):
    if isinstance(x, torch.dtype):
        return _dtype_name(x)
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    return str(x)


def _export_onnx(module: ExportModule, args: tuple, names: list[str], outputs: list[str], path: Path) -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise UserInputError(f"--format onnx needs the packages onnx and onnxscript ({e}): expected them installed "
                             "(pip install 'ctrl-rl[export]'), or --format pt2") from None
    # the dynamo exporter logs a warning per torchvision op it cannot register; torchvision is not used here
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)

    batch = torch.export.Dim("batch", min=1)
    dyn = (tuple({0: batch} for _ in args),)  # forward(*inputs): one var-positional parameter
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=names, output_names=outputs, dynamo=True,
                          dynamic_shapes=dyn, external_data=False, verbose=False,
                          optimize=getattr(module.policy, "onnx_optimize", True))


def _export_pt2(module: ExportModule, args: tuple, path: Path) -> None:
    batch = torch.export.Dim("batch", min=1)
    ep = torch.export.export(module, args, dynamic_shapes=(tuple({0: batch} for _ in args),))
    torch.export.save(ep, str(path))


def _add_onnx_metadata(path: Path, meta: dict) -> None:
    import onnx

    model = onnx.load(str(path))
    del model.metadata_props[:]
    for k, v in {"ctrl_rl": json.dumps(meta, default=_json_default), "ctrl_rl.algo": meta["algo"],
                 "ctrl_rl.env": meta["env"], "ctrl_rl.control_hz": str(meta["control_hz"]),
                 "ctrl_rl.checkpoint_sha256": meta["checkpoint"]["sha256"],
                 **onnx_deploy_props(meta["deploy"])}.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = k, v
    onnx.save(model, str(path))


def _max_diff(got: Sequence, want: Sequence[torch.Tensor]) -> float:
    return max(float((torch.as_tensor(g).double() - w.double()).abs().max()) if w.numel() else 0.0
               for g, w in zip(got, want))


def export_run(path: str, opts: ExportOptions = ExportOptions()) -> dict:
    """Export the policy of a run directory or checkpoint file (module docstring); returns ``policy.json``'s
    content, with ``out`` the directory written."""
    from ctrl_rl.learn.evaluate import load_policy

    algo, run, ck_path, ck = load_policy(path, "cpu")
    spec = algo.spec  # the agent's: actions in [-1, 1]
    env_spec = spec_of(run.env)  # the env's own action bounds and robot metadata, no env built where avoidable
    robot, units, space = _robot_and_units(env_spec)
    policy: nn.Module = algo.exportable().eval()
    chunk_policy = policy if isinstance(policy, ChunkPolicy) else None  # a chunk policy (VLA) keeps its own state
    chunk = chunk_policy.chunk if chunk_policy is not None else None
    recurrent = isinstance(algo, Recurrent) and chunk is None
    language_policy = policy if isinstance(policy, LanguagePolicy) else None
    language = language_policy.language_input() if language_policy is not None else None
    if language is not None:  # the graph takes the prompt's token ids; the runtime tokenises the instruction
        parts = tuple(ObsPart("language", (language["max_length"],), torch.int64) if p.name == "language" else p
                      for p in spec.parts)
        spec = dataclasses.replace(spec, obs_parts=parts)
    module = ExportModule(policy, spec, recurrent, env_spec).eval()
    gen = torch.Generator().manual_seed(opts.seed)
    hidden0 = None
    if recurrent:
        assert isinstance(policy, RecurrentPolicy)  # a Recurrent algorithm's exportable() has initial_hidden
        hidden0 = policy.initial_hidden(1)
    args = example_inputs(env_spec if recurrent else spec, opts.batch, gen, hidden0)
    with torch.no_grad():
        want = module(*args)
    want = want if isinstance(want, tuple) else (want,)
    names = [input_name(p.name) for p in spec.parts] + (["prev_action", "prev_reward", "hidden"] if recurrent else [])
    outputs = ["action", "next_hidden"] if recurrent else ["action"]

    execute_steps = chunk_policy.execute_steps if chunk_policy is not None else None

    ck_dir = ck_path.parent.parent
    config_path = ck_dir / "config.json"
    meta = {
        "format": "ctrl_rl.export", "format_version": FORMAT_VERSION, "algo": str(ck["algo"]), "env": run.env,
        "inputs": [{"name": n, "part": p.name, "shape": ["batch", *p.shape], "dtype": _dtype_name(p.dtype),
                    **({"encoding": "prompt token ids (see language)"} if language and p.name == "language" else {})}
                   for n, p in zip(names, spec.parts)],
        "outputs": outputs,
        "action": ({"kind": "discrete", "n": spec.action_dim, "dtype": "int64", "shape": ["batch"]} if spec.discrete
                   else {"kind": "continuous", "shape": ["batch", *([chunk] if chunk else []), spec.action_dim],
                         "dtype": "float32",
                         **({"chunk": chunk, "execute_steps": execute_steps} if chunk else {}),
                         "low": list(env_spec.action_low), "high": list(env_spec.action_high),
                         "units": units, "space": space}),
        "recurrent": ({"prev_action": ["batch", spec.action_dim], "prev_reward": ["batch"],
                       "hidden": ["batch", *hidden0.shape[1:]], "start": "zeros for prev_action, prev_reward and "
                       "hidden at an episode's first step; feed next_hidden back as hidden"} if hidden0 is not None
                      else None),
        "language": language,
        "control_hz": (1.0 / spec.dt) if spec.dt > 0 else None,
        "dt": spec.dt or None,
        "robot": robot,
        "deploy": deploy_metadata(spec, env_spec, names),
        "checkpoint": {"path": str(ck_path.resolve()), "sha256": file_sha256(ck_path),
                       "step": int(ck["counters"]["step"])},
        "training_config": json.loads(config_path.read_text()) if config_path.exists() else ck.get("config"),
        "versions": {"torch": torch.__version__},
        "files": {},
        "parity": {},
    }
    out = Path(opts.out) if opts.out else ck_dir / "export"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would survive the rename
    try:
        if language is not None:
            assert language_policy is not None  # language comes from it
            language_policy.save_tokenizer(tmp)
            meta["files"]["tokenizer"] = language["tokenizer"]
        if "onnx" in opts.format:
            f = tmp / "policy.onnx"
            _export_onnx(module, args, names, outputs, f)
            _add_onnx_metadata(f, {**meta, "files": {}, "parity": {}})
            sess = onnx_session(f)
            got = sess.run(None, {n: a.numpy() for n, a in zip(names, args)})
            meta["parity"]["onnx"] = _max_diff(got, want)
            meta["files"]["onnx"] = f.name
            import onnxruntime
            meta["versions"]["onnxruntime"] = onnxruntime.__version__
        if "pt2" in opts.format:
            f = tmp / "policy.pt2"
            _export_pt2(module, args, f)
            loaded = torch.export.load(str(f)).module()
            with torch.no_grad():
                got = loaded(*args)
            meta["parity"]["pt2"] = _max_diff(got if isinstance(got, tuple) else (got,), want)
            meta["files"]["pt2"] = f.name
        bad = {k: v for k, v in meta["parity"].items() if not v <= PARITY_TOL}
        if bad:
            raise RuntimeError(f"exported graphs differ from the eager policy by {bad} (> {PARITY_TOL})")
        if "onnx" in opts.format:  # the final metadata, parity included
            _add_onnx_metadata(tmp / "policy.onnx", meta)
        (tmp / "policy.json").write_text(json.dumps(meta, indent=2, default=_json_default) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**meta, "out": str(out)}
