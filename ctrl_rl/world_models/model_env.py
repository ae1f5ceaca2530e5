"""A learned dynamics model as a BatchedEnv (``ModelEnv``), and one round of imagined rollouts (``imagine``).

Shape letters: N envs (imagined rollouts in lock step), M start states, O obs dim, A action dim, K elites.

``ModelEnv`` keeps the BatchedEnv contract of ``ctrl_rl/envs/protocol.py`` (``check_env`` passes), so the
code that drives a real env drives a model the same way. One ``step(action)``:

1. member per row: ``"step"`` mode draws a random elite for every row on every step (MBPO, MOPO, RAVL:
   "a random elite per transition", docs/algorithms/mbpo.md#which-member-predicts); ``"episode"`` mode uses the member
   drawn
   when that env's imagined episode started and keeps it until the env resets (NeuBay's posterior sample per
   episode, 5.3 and 5.6 pitfall 3);
2. ``model.predict(obs, action, members, sample=True, generator)``: next obs and reward sampled from that
   member's Gaussian with the env's own generator, plus the uncertainty figures of
   ``world_models.protocol``;
3. reward = raw reward - ``penalty`` * uncertainty[``penalty_kind``] (MOPO; RAVL and NeuBay use 0); the raw
   reward is kept in ``info["raw_reward"]``;
4. a non-finite next obs or reward (or epistemic figure, when it truncates) raises ``ModelDiverged`` naming
   the step: one host sync per step, the only one;
5. terminated: ``termination_fn(obs, action, next_obs)`` when given, else the model's own termination head,
   else never;
6. truncated (never together with terminated; a terminal state wins): the episode reached ``horizon``
   steps, or, with ``truncate_above``, the step's epistemic uncertainty exceeds it (NeuBay's adaptive
   truncation, 5.2: truncate, not terminate, so the value still bootstraps from ``final_obs``);
7. auto-reset in the same step as the protocol prescribes: where an episode ended, ``final_obs`` holds the
   predicted next obs and ``obs`` a new start state (and, in episode mode, the env gets a new member).

Like the torch simulators (``envs/torch_envs/base.py``), every step draws a fresh start state (and in
episode mode a fresh member) for *every* env and keeps it only where an episode ended: no ``done.any()``,
no per-env loop, and the generator's consumption does not depend on which envs ended, so a run is
reproducible from ``(seed, actions)`` and ``state_dict()`` resumes it bit-exactly. Start states come
uniformly from ``start_obs`` (RAVL: dataset states) or from ``start_sampler(n, generator)``.

``info`` of every step (each ``[N]``): ``aleatoric``, ``epistemic``, ``total_var`` (those the model
reports), ``member`` (int64 member id used), ``raw_reward`` (before the penalty), ``elapsed_step`` (steps
of the episode the transition belongs to, 1 on the first step after a reset).

Actions are used as given (not clipped to the bounds: the model sees what the actor produced, as in MBPO
and RAVL, whose tanh actors stay inside the bounds anyway).

``imagine(env, act_fn, steps, buffer)`` is the rollout round of MBPO / RAVL / NeuBay on any BatchedEnv
(``ModelEnv`` or a true-dynamics env): reset, then ``steps`` steps with the actor, adding every transition
of a rollout that is still alive to a ``ReplayBuffer``. A rollout dies at its first terminated or truncated
transition (that transition is stored, with ``final_obs`` as next obs); the env auto-resets it, as every
BatchedEnv does, but the transitions of that new episode are dropped until the round ends ("stop extending
done rollouts", 4.2). The round stops early once every rollout has died.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from ctrl_rl.core.obs import Obs, obs_batch_size, obs_index
from ctrl_rl.envs.protocol import BatchedEnv, EnvSpec, StepOut
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.replay import ReplayBuffer
from ctrl_rl.world_models.protocol import UNCERTAINTIES, DynamicsModel, ModelStep

MemberMode = Literal["step", "episode"]
PenaltyKind = Literal["aleatoric", "epistemic", "total_var"]
TerminationFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (obs, act, next_obs) -> [N] bool
StartSampler = Callable[[int, torch.Generator], torch.Tensor]  # (n, generator) -> [n,O] start observations


class ModelDiverged(UserInputError):
    """The model predicted a NaN/inf next observation or reward; the message names the step.

    A ``UserInputError`` so that the CLI prints the one sentence and stops (exit code 2): the model the user
    trained (or its settings: horizon, learning rate) is what went wrong, not the library.
    """


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise UserInputError(msg)


def _bounds(values: Sequence[float] | torch.Tensor, what: str, dim: int) -> tuple[float, ...]:
    vals = tuple(float(v) for v in (values.tolist() if isinstance(values, torch.Tensor) else values))
    _need(len(vals) == dim and all(math.isfinite(v) for v in vals),
          f"ModelEnv {what} has {len(vals)} entries {vals}, expected {dim} finite numbers (the model's act_dim).")
    return vals


class ModelEnv:
    """A dynamics model as a BatchedEnv (see the module docstring).

    Args:
        model: a ``DynamicsModel`` (``world_models.protocol``); it predicts in the env's own units.
        start_obs: ``[M,O]`` start states (RAVL: dataset observations); ``None`` when ``start_sampler`` is given.
        num_envs: N, imagined rollouts stepped in lock step.
        action_low, action_high: the bounds of the actions the model takes, those it was fitted on: the agent's
            [-1, 1] (the training spec's bounds; ``storage.datasets.open_dataset`` maps a dataset's actions there).
        base_env_id: the real env's id; the spec's id is ``model:<base_env_id>``.
        termination_fn: ``(obs [N,O], act [N,A], next_obs [N,O]) -> [N] bool`` (e.g. hopper's healthy
            check); None uses the model's termination head, or never terminates when it has none.
        member_mode: ``"step"`` a random elite per transition (RAVL), ``"episode"`` one elite per imagined
            episode (NeuBay).
        horizon: truncate an episode after this many steps (``spec.max_episode_steps``); None: no limit.
        penalty: lambda of the reward penalty ``reward = raw - lambda * uncertainty`` (MOPO); 0 turns it off.
        penalty_kind: which uncertainty figure the penalty uses (``world_models.protocol.UNCERTAINTIES``).
        truncate_above: truncate at the first step whose epistemic uncertainty exceeds this (NeuBay's
            ``u_max``); None: never.
        start_sampler: ``(n, generator) -> [n,O]`` start states, instead of ``start_obs`` (e.g. the last
            observation of a history prefix).
        device: where everything lives; None: the device of ``model.elites``.
        seed: seed of the env's generator (start states, members, the model's sampling noise).
    """

    def __init__(self, model: DynamicsModel, start_obs: torch.Tensor | None, num_envs: int,
                 action_low: Sequence[float] | torch.Tensor, action_high: Sequence[float] | torch.Tensor,
                 base_env_id: str, termination_fn: TerminationFn | None = None, member_mode: MemberMode = "step",
                 horizon: int | None = None, penalty: float = 0.0, penalty_kind: PenaltyKind = "aleatoric",
                 truncate_above: float | None = None, start_sampler: StartSampler | None = None,
                 device: torch.device | str | None = None, seed: int = 0):
        _need(isinstance(model, DynamicsModel),
              f"ModelEnv model is a {type(model).__name__}, expected a DynamicsModel (obs_dim, act_dim, elites, "
              "num_members, predict).")
        O, A = int(model.obs_dim), int(model.act_dim)
        _need(isinstance(num_envs, int) and not isinstance(num_envs, bool) and num_envs >= 1,
              f"ModelEnv num_envs is {num_envs!r}, expected an integer >= 1.")
        _need(member_mode in ("step", "episode"),
              f"ModelEnv member_mode is {member_mode!r}, expected 'step' or 'episode'.")
        _need(horizon is None or (isinstance(horizon, int) and horizon >= 1),
              f"ModelEnv horizon is {horizon!r}, expected None or an integer >= 1.")
        _need(isinstance(penalty, (int, float)) and math.isfinite(penalty) and penalty >= 0,
              f"ModelEnv penalty is {penalty!r}, expected a finite number >= 0.")
        _need(penalty_kind in UNCERTAINTIES,
              f"ModelEnv penalty_kind is {penalty_kind!r}, expected one of {UNCERTAINTIES}.")
        _need(truncate_above is None or (isinstance(truncate_above, (int, float)) and not math.isnan(truncate_above)),
              f"ModelEnv truncate_above is {truncate_above!r}, expected None or a number.")
        _need((start_obs is None) != (start_sampler is None),
              "ModelEnv needs exactly one of start_obs (a [M,O] tensor of start states) and start_sampler.")
        low, high = _bounds(action_low, "action_low", A), _bounds(action_high, "action_high", A)
        _need(all(lo <= hi for lo, hi in zip(low, high)),
              f"ModelEnv action bounds {low} .. {high} must have action_low <= action_high.")
        self.model = model
        self.device = torch.device(device) if device is not None else model.elites.device
        _need(model.elites.numel() >= 1, "ModelEnv model has no elite members, expected at least one.")
        if start_obs is not None:
            _need(isinstance(start_obs, torch.Tensor) and start_obs.dim() == 2 and start_obs.shape[1] == O,
                  f"ModelEnv start_obs has shape {tuple(getattr(start_obs, 'shape', ()))}, expected [M,{O}] "
                  f"(M start states of the model's obs_dim {O}).")
            _need(start_obs.shape[0] >= 1, f"ModelEnv start_obs is empty (shape {tuple(start_obs.shape)}), expected "
                  "at least one start state.")
            start_obs = start_obs.to(device=self.device, dtype=torch.float32)  # [M,O]
            _need(bool(torch.isfinite(start_obs).all()),
                  "ModelEnv start_obs holds NaN or inf values, expected finite states.")
        self.start_obs, self.start_sampler = start_obs, start_sampler
        self.num_envs, self.obs_dim, self.act_dim = num_envs, O, A
        self.termination_fn, self.member_mode, self.horizon = termination_fn, member_mode, horizon
        self.penalty, self.penalty_kind, self.truncate_above = float(penalty), penalty_kind, truncate_above
        self.spec = EnvSpec(env_id=f"model:{base_env_id}", obs_shape=(O,), discrete=False, action_dim=A,
                            action_low=low, action_high=high, max_episode_steps=horizon, backend="model")
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        self.t = 0  # step() calls since the last reset()
        self.reset()

    # ---- draws from the env's generator --------------------------------------------------------

    def _draw_starts(self, n: int) -> torch.Tensor:
        if self.start_sampler is None:
            assert self.start_obs is not None  # __init__ takes exactly one of start_obs and start_sampler
            idx = torch.randint(self.start_obs.shape[0], (n,), generator=self.generator, device=self.device)  # [n]
            return self.start_obs[idx]  # [n,O]
        start = self.start_sampler(n, self.generator)
        _need(isinstance(start, torch.Tensor) and tuple(start.shape) == (n, self.obs_dim),
              f"ModelEnv start_sampler returned shape {tuple(getattr(start, 'shape', ()))}, "
              f"expected ({n}, {self.obs_dim}).")
        return start.to(device=self.device, dtype=torch.float32)  # [n,O]

    def _draw_members(self, n: int) -> torch.Tensor:
        elites = self.model.elites.to(self.device)  # [K]; read every time: a retrained model may change them
        return elites[torch.randint(elites.numel(), (n,), generator=self.generator, device=self.device)]  # [n]

    # ---- the BatchedEnv protocol ---------------------------------------------------------------

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """New start states (and members) for every env; re-seed the generator first when ``seed`` is given."""
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self.obs = self._draw_starts(self.num_envs)  # [N,O]; never written in place (returned to callers)
        self.members = self._draw_members(self.num_envs)  # [N]; used in episode mode
        self.elapsed = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)  # [N]
        self.t = 0
        return self.obs

    def step(self, action: torch.Tensor) -> StepOut:
        """One imagined step of every env, with same-step auto-reset (see the module docstring)."""
        n = self.num_envs
        action = torch.as_tensor(action, device=self.device)
        _need(tuple(action.shape) == (n, self.act_dim) and action.is_floating_point(),
              f"{self.spec.env_id} expects float actions of shape ({n}, {self.act_dim}), got {action.dtype} of shape "
              f"{tuple(action.shape)}.")
        action = action.to(torch.float32)  # [N,A]
        self.t += 1
        members = self.members if self.member_mode == "episode" else self._draw_members(n)  # [N]
        with torch.no_grad():
            pred = self.model.predict(self.obs, action, members, sample=True, generator=self.generator)
        next_obs, raw_reward, unc = self._check_prediction(pred)  # [N,O], [N], {key: [N]}
        reward = raw_reward - self.penalty * unc[self.penalty_kind] if self.penalty else raw_reward  # [N]
        finite = torch.isfinite(next_obs).all() & torch.isfinite(reward).all()
        if self.truncate_above is not None:
            finite &= torch.isfinite(unc["epistemic"]).all()
        if not bool(finite):  # the step's one host sync
            self._diverged(next_obs, reward, unc)
        if self.termination_fn is not None:
            terminated = self.termination_fn(self.obs, action, next_obs)
            _need(isinstance(terminated, torch.Tensor) and tuple(terminated.shape) == (n,),
                  f"ModelEnv termination_fn returned shape {tuple(getattr(terminated, 'shape', ()))}, expected ({n},).")
            terminated = terminated.to(device=self.device, dtype=torch.bool)  # [N]
        elif pred.terminated is not None:
            terminated = pred.terminated.to(device=self.device, dtype=torch.bool).reshape(n)  # [N]
        else:
            terminated = torch.zeros(n, dtype=torch.bool, device=self.device)  # [N]
        elapsed = self.elapsed + 1  # [N]
        truncated = torch.zeros(n, dtype=torch.bool, device=self.device)  # [N]
        if self.horizon is not None:
            truncated |= elapsed >= self.horizon
        if self.truncate_above is not None:
            truncated |= unc["epistemic"] > self.truncate_above
        truncated &= ~terminated  # a terminal state reached on a cut step counts as terminated
        done = terminated | truncated  # [N]
        fresh = self._draw_starts(n)  # [N,O]; drawn every step, kept where done (see the module docstring)
        self.obs = torch.where(done.unsqueeze(1), fresh, next_obs)  # [N,O]
        if self.member_mode == "episode":
            self.members = torch.where(done, self._draw_members(n), self.members)  # [N]
        self.elapsed = elapsed.masked_fill(done, 0)  # [N]; out of place: `elapsed` is returned in info
        info: dict[str, Any] = {k: unc[k] for k in UNCERTAINTIES if k in unc}
        info.update(member=members, raw_reward=raw_reward, elapsed_step=elapsed)
        return StepOut(obs=self.obs, reward=reward, terminated=terminated, truncated=truncated, final_obs=next_obs,
                       info=info)

    def close(self) -> None:
        pass

    def _check_prediction(self, pred: ModelStep) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Shapes of the model's prediction (metadata only) and the uncertainty keys this env needs."""
        n = self.num_envs
        _need(tuple(pred.next_obs.shape) == (n, self.obs_dim) and tuple(pred.reward.shape) == (n,),
              f"ModelEnv model.predict returned next_obs {tuple(pred.next_obs.shape)} and reward "
              f"{tuple(pred.reward.shape)}, expected ({n}, {self.obs_dim}) and ({n},).")
        unc = pred.uncertainty
        if self.penalty:
            _need(self.penalty_kind in unc, f"ModelEnv penalty_kind {self.penalty_kind!r} is not among the uncertainty "
                  f"figures the model reports, {sorted(unc)}.")
        if self.truncate_above is not None:
            _need("epistemic" in unc, "ModelEnv truncate_above needs the model's 'epistemic' uncertainty, "
                  "which it does "
                  f"not report (it reports {sorted(unc)}).")
        return pred.next_obs.to(torch.float32), pred.reward.to(torch.float32), unc

    def _diverged(self, next_obs: torch.Tensor, reward: torch.Tensor, unc: dict[str, torch.Tensor]) -> None:
        bad = ~torch.isfinite(next_obs).all(dim=1) | ~torch.isfinite(reward)  # [N]
        if self.truncate_above is not None:
            bad |= ~torch.isfinite(unc["epistemic"])
        raise ModelDiverged(
            f"The model of {self.spec.env_id} predicted NaN/inf values at step {self.t} after the last reset "
            f"(in {int(bad.sum())} of {self.num_envs} imagined rollouts), so the model has diverged: check its "
            "training or use a shorter horizon.")

    # ---- checkpointing -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-exactly (the model's own weights are not included)."""
        return {"env_id": self.spec.env_id, "num_envs": self.num_envs, "generator": self.generator.get_state(),
                "obs": self.obs.clone(), "members": self.members.clone(), "elapsed": self.elapsed.clone(), "t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _need(state.get("env_id") == self.spec.env_id and state.get("num_envs") == self.num_envs,
              f"ModelEnv state is for {state.get('env_id')!r} with {state.get('num_envs')} envs, expected "
              f"{self.spec.env_id!r} with {self.num_envs}.")
        _need(tuple(state["obs"].shape) == (self.num_envs, self.obs_dim),
              f"ModelEnv state holds obs of shape {tuple(state['obs'].shape)}, "
              f"expected ({self.num_envs}, {self.obs_dim}).")
        self.obs = state["obs"].to(device=self.device, dtype=torch.float32, copy=True)  # [N,O]
        self.members = state["members"].to(device=self.device, dtype=torch.int64, copy=True)  # [N]
        self.elapsed = state["elapsed"].to(device=self.device, dtype=torch.int64, copy=True)  # [N]
        self.t = int(state["t"])
        self.generator.set_state(state["generator"])


# ---- the rollout round ---------------------------------------------------------------------------


def add_transitions(buffer: ReplayBuffer, obs: Obs, action: torch.Tensor, reward: torch.Tensor, next_obs: Obs,
                    terminated: torch.Tensor, truncated: torch.Tensor) -> None:
    """``buffer.add`` for any number of rows: in chunks of at most ``buffer.capacity`` (``ReplayBuffer.add``
    refuses a step larger than the buffer), which leaves the buffer as row-by-row FIFO adds would."""
    n, cap = obs_batch_size(obs), buffer.capacity
    if n <= cap:
        buffer.add(obs, action, reward, next_obs, terminated, truncated)
        return
    for i in range(0, n, cap):
        s = slice(i, i + cap)
        buffer.add(obs_index(obs, s), action[s], reward[s], obs_index(next_obs, s), terminated[s], truncated[s])


def imagine(env: BatchedEnv, act_fn: Callable[[Obs], torch.Tensor], steps: int, buffer: ReplayBuffer | None = None,
            reset: bool = True, obs: Obs | None = None) -> dict[str, float]:
    """One round of imagined rollouts: ``steps`` steps of every env with ``act_fn``'s actions.

    Every transition of a rollout that is still alive goes to ``buffer`` as (obs, action, reward, final_obs,
    terminated, truncated), in time-major order (step 0 of every env, then step 1, ...). A rollout dies after
    its first terminated or truncated transition; the env's auto-reset continues it from a new start, but
    those transitions are not added (see the module docstring). The round ends after ``steps`` steps or once
    no rollout is alive. One host sync per step (the alive count, which also sizes the masked add).

    Args:
        env: any BatchedEnv (``ModelEnv``, or a true-dynamics env); ``info`` keys ``raw_reward``,
            ``aleatoric``, ``epistemic``, ``total_var`` are averaged when present.
        act_fn: ``obs -> action`` (the current actor, sampling), called under ``torch.no_grad()``.
        steps: the rollout length k (RAVL 5; NeuBay: the env's horizon).
        buffer: where the transitions go, or None to only collect the statistics.
        reset: start from ``env.reset()`` (new start states); False continues from ``obs``, every env alive.
        obs: the observation to continue from when ``reset`` is False (the last ``StepOut.obs``).

    Returns:
        ``rollout/starts`` (N), ``rollout/transitions`` (added), ``rollout/steps`` (steps taken),
        ``rollout/terminated`` and ``rollout/truncated`` (rollouts that ended so), ``rollout/alive``
        (still running at the end), ``rollout/length_mean``, and the means over the added transitions of
        ``reward`` and of the info keys present (``rollout/<key>_mean``), plus ``rollout/epistemic_max``.
    """
    _need(isinstance(steps, int) and steps >= 1, f"imagine steps is {steps!r}, expected an integer >= 1.")
    if reset:
        obs = env.reset()
    if obs is None:
        raise UserInputError(
            "imagine with reset=False needs obs, the observation the envs are in (the last StepOut.obs).")
    n, device = env.num_envs, env.device
    alive = torch.ones(n, dtype=torch.bool, device=device)  # [N]
    n_alive, added, taken = n, 0, 0
    sums: dict[str, torch.Tensor] = {}  # masked sums over the added transitions, each a 0-dim device tensor
    ended = {"terminated": torch.zeros((), dtype=torch.int64, device=device),
             "truncated": torch.zeros((), dtype=torch.int64, device=device)}
    epi_max = None
    with torch.no_grad():
        for _ in range(steps):
            if n_alive == 0:
                break
            action = act_fn(obs)  # [N,A]
            out: StepOut = env.step(action)
            if buffer is not None:
                if n_alive == n:
                    add_transitions(buffer, obs, action, out.reward, out.final_obs, out.terminated, out.truncated)
                else:
                    add_transitions(buffer, obs_index(obs, alive), action[alive], out.reward[alive],
                                    obs_index(out.final_obs, alive), out.terminated[alive], out.truncated[alive])
            weight = alive.to(torch.float32)  # [N]
            values = {"reward": out.reward, **{k: out.info[k] for k in ("raw_reward", *UNCERTAINTIES) if k in out.info}}
            for k, v in values.items():
                s = (v.to(torch.float32) * weight).sum()
                sums[k] = s if k not in sums else sums[k] + s
            if "epistemic" in out.info:
                m = torch.where(alive, out.info["epistemic"].to(torch.float32), -torch.inf).max()
                epi_max = m if epi_max is None else torch.maximum(epi_max, m)
            ended["terminated"] += (out.terminated & alive).sum()
            ended["truncated"] += (out.truncated & alive).sum()
            added += n_alive
            taken += 1
            alive = alive & ~out.done  # [N]
            obs = out.obs
            n_alive = int(alive.sum())  # host sync
    keys = list(sums) + list(ended) + (["epistemic_max"] if epi_max is not None else [])
    tensors = [sums[k] / max(added, 1) for k in sums] + [ended[k].float() for k in ended] + (
        [epi_max] if epi_max is not None else [])
    values = torch.stack(tensors).tolist() if tensors else []  # one host sync for the statistics
    stats = {"rollout/starts": float(n), "rollout/transitions": float(added), "rollout/steps": float(taken),
             "rollout/alive": float(n_alive), "rollout/length_mean": added / n}
    for k, v in zip(keys, values):
        stats[f"rollout/{k}" if k in ended or k == "epistemic_max" else f"rollout/{k}_mean"] = v
    return stats
