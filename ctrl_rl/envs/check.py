"""check_env: assert that an env keeps the BatchedEnv contract (see ctrl_rl/envs/protocol.py).

``check_env(env)`` drives the env with uniform random actions and raises ``AssertionError`` with a
message naming the env and the broken rule. It checks:

- the spec: obs shape, action dim and bounds (finite, low <= high; empty for discrete), dt, time
  limit, backend and id prefix; for an env with several observation parts (``spec.obs_parts``):
  distinct names, images ``image/<camera>`` uint8 ``[C,H,W]``, language int64 token ids ``[L]`` or a
  float embedding ``[D]``, and ``obs_shape`` the shape of the ``state`` part (``()`` without one);
- ``reset()`` and every ``step()``: shapes ``[N,*obs_shape]`` / ``[N]``, dtypes (float32 obs and
  rewards, bool flags), device, finite values; a multi-part observation is a dict holding exactly the
  spec's parts, each ``[N,*part.shape]`` with the part's dtype, on the env's device, float parts
  finite and token ids >= 0;
- ``terminated & truncated`` never both set; ``final_obs == obs`` (every part) where the episode did
  not end;
- auto-reset where it can be seen: where an episode ended, ``obs`` differs from ``final_obs`` in at
  least one part (a new episode started); no episode runs past ``spec.max_episode_steps`` and every
  episode that reaches it ends; when the env reports ``info["elapsed_step"]`` (steps of the episode
  each step belongs to) it must count 1, 2, ... from every reset, so the step after an auto-reset is
  a real first step;
- returned tensors are not overwritten by later steps;
- seeding: ``reset(seed)`` twice gives the same observations and the same first steps, and a
  ``twin`` env made with the same arguments gives the same first ``reset()`` observation.

``check_env`` leaves the env in a running state; the caller still owns (and closes) it.
"""

from __future__ import annotations

import math

import torch

from ctrl_rl.core.obs import Obs, obs_clone, obs_equal, obs_index, state_shape
from ctrl_rl.envs.backends import prefix_of
from ctrl_rl.envs.protocol import BatchedEnv, EnvSpec, StepOut


def random_actions(spec: EnvSpec, num_envs: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Uniform random actions: ``[N,A]`` float32 within the spec's bounds, or ``[N]`` int64 for discrete.

    ``generator`` must live on ``device``.
    """
    if spec.discrete:
        return torch.randint(spec.action_dim, (num_envs,), generator=generator, device=device)  # [N]
    low = torch.tensor(spec.action_low, dtype=torch.float32, device=device)  # [A]
    high = torch.tensor(spec.action_high, dtype=torch.float32, device=device)  # [A]
    u = torch.rand(num_envs, spec.action_dim, generator=generator, device=device)  # [N,A]
    return torch.minimum(low + u * (high - low), high)  # [N,A]; min guards float round-up past high


def check_env(env: BatchedEnv, steps: int = 300, twin: BatchedEnv | None = None, seed: int = 12345) -> None:
    """Assert the BatchedEnv contract on ``env`` (see the module docstring); raises AssertionError.

    Args:
        env: the env under test (its first ``reset()`` should be the first since it was made when
            ``twin`` is given).
        steps: random-action steps to drive the env for; pick more than ``spec.max_episode_steps``
            to see time-limit resets.
        twin: optional second env made with the same arguments (same seed); its first ``reset()``
            must equal ``env``'s.
        seed: seed used for the seeded-reset checks and the random actions.
    """
    name = f"{type(env).__name__}({getattr(getattr(env, 'spec', None), 'env_id', '?')})"

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise AssertionError(f"check_env {name}: {msg}")

    need(isinstance(env, BatchedEnv),
         "does not have the BatchedEnv attributes num_envs, spec, device, reset, step, close")
    _check_spec(env, need)
    n, spec, device = env.num_envs, env.spec, env.device

    # First reset (and twin determinism: two envs made with the same seed start alike).
    obs0 = env.reset()
    _check_obs(obs0, "reset()", n, spec, device, need)
    if twin is not None:
        twin_obs = twin.reset()
        _check_obs(twin_obs, "twin.reset()", n, spec, device, need)
        need(obs_equal(obs0, twin_obs), "two envs made with the same seed give different first observations")

    # Seeded resets are deterministic, and so are the first steps after them.
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    probe = [random_actions(spec, n, device, gen) for _ in range(3)]
    runs = []
    for _ in range(2):
        trace = [obs_clone(env.reset(seed=seed))]
        trace += [obs_clone(env.step(a).obs) for a in probe]
        runs.append(trace)
    need(obs_equal(runs[0][0], runs[1][0]), f"reset(seed={seed}) twice gives different observations")
    need(
        all(obs_equal(a, b) for a, b in zip(runs[0], runs[1])),
        f"the same actions after reset(seed={seed}) give different observations",
    )

    # Random-action rollout.
    obs = env.reset(seed=seed)
    _check_obs(obs, f"reset(seed={seed})", n, spec, device, need)
    ep_len = torch.zeros(n, dtype=torch.int64, device=device)  # [N] steps since each env's reset
    limit = spec.max_episode_steps
    prev: StepOut | None = None
    prev_copy: tuple[Obs, Obs] | None = None
    for t in range(steps):
        action = random_actions(spec, n, device, gen)
        _check_action(action, spec, n, need)
        out = env.step(action)
        where = f"step {t}"
        need(isinstance(out, StepOut), f"{where}: step() returned {type(out).__name__}, expected StepOut")
        _check_obs(out.obs, f"{where} obs", n, spec, device, need)
        _check_obs(out.final_obs, f"{where} final_obs", n, spec, device, need)
        _check_vec(out.reward, f"{where} reward", n, torch.float32, device, need)
        need(bool(torch.isfinite(out.reward).all()), f"{where}: reward has non-finite values")
        _check_vec(out.terminated, f"{where} terminated", n, torch.bool, device, need)
        _check_vec(out.truncated, f"{where} truncated", n, torch.bool, device, need)
        need(not bool((out.terminated & out.truncated).any()), f"{where}: terminated and truncated both set for an env")
        done = out.done  # [N]
        need(
            obs_equal(obs_index(out.obs, ~done), obs_index(out.final_obs, ~done)),
            f"{where}: final_obs differs from obs for envs whose episode did not end",
        )
        need(
            bool(_rows_differ(out.obs, out.final_obs, n)[done].all()),
            f"{where}: obs equals final_obs for an env whose episode ended (no auto-reset in the same step?)",
        )
        ep_len += 1
        if "elapsed_step" in out.info:
            elapsed = out.info["elapsed_step"].to(device=device, dtype=torch.int64)
            need(
                torch.equal(elapsed, ep_len),
                f"{where}: info['elapsed_step'] {elapsed.tolist()} != steps since reset {ep_len.tolist()} "
                "(is the step after an auto-reset a real step?)",
            )
        if limit is not None:
            need(bool((ep_len <= limit).all()), f"{where}: an episode ran past max_episode_steps={limit}")
            need(bool(done[ep_len == limit].all()),
                 f"{where}: an episode reached max_episode_steps={limit} without ending")
        ep_len.masked_fill_(done, 0)
        if prev is not None and prev_copy is not None:
            need(
                obs_equal(prev.obs, prev_copy[0]) and obs_equal(prev.final_obs, prev_copy[1]),
                f"{where}: tensors returned by the previous step were overwritten",
            )
        prev, prev_copy = out, (obs_clone(out.obs), obs_clone(out.final_obs))


def _check_spec(env: BatchedEnv, need) -> None:
    spec = env.spec
    need(isinstance(spec, EnvSpec), f"spec is {type(spec).__name__}, expected EnvSpec")
    need(isinstance(env.num_envs, int) and env.num_envs >= 1, f"num_envs={env.num_envs!r}, expected an int >= 1")
    need(isinstance(env.device, torch.device), f"device is {type(env.device).__name__}, expected torch.device")
    if spec.is_flat:
        need(
            isinstance(spec.obs_shape, tuple) and len(spec.obs_shape) >= 1
            and all(isinstance(s, int) and s >= 1 for s in spec.obs_shape),
            f"spec.obs_shape={spec.obs_shape!r}, expected a tuple of positive ints",
        )
    else:
        _check_parts(spec, need)
    need(isinstance(spec.action_dim, int) and spec.action_dim >= 1,
         f"spec.action_dim={spec.action_dim!r}, expected an int >= 1")
    if spec.discrete:
        need(spec.action_low == () and spec.action_high == (), "discrete spec has action bounds, expected empty tuples")
    else:
        need(
            len(spec.action_low) == spec.action_dim and len(spec.action_high) == spec.action_dim,
            f"action bounds have lengths {len(spec.action_low)}/{len(spec.action_high)}, "
            f"expected action_dim={spec.action_dim}",
        )
        need(
            all(math.isfinite(lo) and math.isfinite(hi) and lo <= hi
                for lo, hi in zip(spec.action_low, spec.action_high)),
            f"action bounds {spec.action_low} .. {spec.action_high} are not finite with low <= high",
        )
    need(math.isfinite(spec.dt) and spec.dt >= 0.0, f"spec.dt={spec.dt!r}, expected a finite number >= 0")
    need(
        spec.max_episode_steps is None or (isinstance(spec.max_episode_steps, int) and spec.max_episode_steps >= 1),
        f"spec.max_episode_steps={spec.max_episode_steps!r}, expected None or an int >= 1",
    )
    prefix = prefix_of(spec.backend)
    prefix = prefix + ":" if prefix is not None else None
    need(
        prefix is None or spec.env_id.startswith(prefix),
        f"spec.env_id={spec.env_id!r} does not start with {prefix!r} (backend {spec.backend!r})",
    )


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _check_parts(spec: EnvSpec, need) -> None:
    """The parts of a multi-part observation are well formed (see the module docstring)."""
    names = [p.name for p in spec.obs_parts]
    need(len(set(names)) == len(names), f"spec.obs_parts has repeated names {names}")
    need(
        tuple(spec.obs_shape) == state_shape(spec.obs_parts),
        f"spec.obs_shape={spec.obs_shape!r}, expected the 'state' part's shape {state_shape(spec.obs_parts)}",
    )
    for p in spec.obs_parts:
        if p.kind == "image":
            need(
                p.dtype == torch.uint8 and len(p.shape) == 3,
                f"image part {p.name!r} is {p.dtype} {list(p.shape)}, expected torch.uint8 [C,H,W]",
            )
        elif p.kind == "language":
            need(
                len(p.shape) == 1 and (p.dtype == torch.int64 or p.dtype.is_floating_point),
                f"language part {p.name!r} is {p.dtype} {list(p.shape)}, "
                "expected int64 token ids [L] or a float embedding [D]",
            )
        elif p.name == "state":
            need(p.dtype.is_floating_point, f"state part has dtype {p.dtype}, expected a floating-point dtype")


def _rows_differ(a: Obs, b: Obs, n: int) -> torch.Tensor:
    """``[N]`` bool: row i of ``a`` differs from row i of ``b`` in at least one element of one part."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)  # _check_obs has checked both against the spec: one form
        return (a.reshape(n, -1) != b.reshape(n, -1)).any(dim=1)  # [N]
    assert isinstance(b, dict)
    differ = torch.zeros(n, dtype=torch.bool, device=next(iter(a.values())).device)  # [N]
    for k, v in a.items():
        differ |= (v.reshape(n, -1) != b[k].reshape(n, -1)).any(dim=1)
    return differ


def _check_obs(x, what: str, n: int, spec: EnvSpec, device: torch.device, need) -> None:
    if not spec.is_flat:
        _check_obs_parts(x, what, n, spec, device, need)
        return
    need(isinstance(x, torch.Tensor), f"{what} is {type(x).__name__}, expected a torch.Tensor")
    need(tuple(x.shape) == (n, *spec.obs_shape), f"{what} has shape {tuple(x.shape)}, expected {(n, *spec.obs_shape)}")
    need(x.dtype == torch.float32, f"{what} has dtype {x.dtype}, expected torch.float32")
    need(_same_device(x.device, device), f"{what} is on {x.device}, expected env.device {device}")
    need(bool(torch.isfinite(x).all()), f"{what} has non-finite values")


def _check_obs_parts(x, what: str, n: int, spec: EnvSpec, device: torch.device, need) -> None:
    names = [p.name for p in spec.parts]
    need(isinstance(x, dict), f"{what} is {type(x).__name__}, expected a dict of the observation parts {names}")
    need(sorted(x) == sorted(names), f"{what} has parts {list(x)}, expected {names}")
    for p in spec.parts:
        v, where = x[p.name], f"{what} part {p.name!r}"
        need(isinstance(v, torch.Tensor), f"{where} is {type(v).__name__}, expected a torch.Tensor")
        need(tuple(v.shape) == (n, *p.shape), f"{where} has shape {tuple(v.shape)}, expected {(n, *p.shape)}")
        need(v.dtype == p.dtype, f"{where} has dtype {v.dtype}, expected {p.dtype}")
        need(_same_device(v.device, device), f"{where} is on {v.device}, expected env.device {device}")
        if v.is_floating_point():
            need(bool(torch.isfinite(v).all()), f"{where} has non-finite values")
        elif p.kind == "language":
            need(bool((v >= 0).all()), f"{where} has negative token ids")


def _check_vec(x, what: str, n: int, dtype: torch.dtype, device: torch.device, need) -> None:
    need(isinstance(x, torch.Tensor), f"{what} is {type(x).__name__}, expected a torch.Tensor")
    need(tuple(x.shape) == (n,), f"{what} has shape {tuple(x.shape)}, expected {(n,)}")
    need(x.dtype == dtype, f"{what} has dtype {x.dtype}, expected {dtype}")
    need(_same_device(x.device, device), f"{what} is on {x.device}, expected env.device {device}")


def _check_action(a: torch.Tensor, spec: EnvSpec, n: int, need) -> None:
    if spec.discrete:
        need(tuple(a.shape) == (n,) and a.dtype == torch.int64, "random discrete actions are not [N] int64")
        need(bool(((a >= 0) & (a < spec.action_dim)).all()), "random discrete actions out of range")
    else:
        low = torch.tensor(spec.action_low, dtype=torch.float32, device=a.device)
        high = torch.tensor(spec.action_high, dtype=torch.float32, device=a.device)
        need(tuple(a.shape) == (n, spec.action_dim) and a.dtype == torch.float32,
             "random actions are not [N,A] float32")
        need(bool(((a >= low) & (a <= high)).all()), "random actions fall outside the spec's bounds")
