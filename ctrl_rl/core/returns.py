"""Return and advantage estimators as pure functions of tensors.

Shape letters: T time, N envs. Every function here is checked against hand-computed numbers in
tests/core/test_returns.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def gae(
    reward: torch.Tensor,  # [T,N]
    value: torch.Tensor,  # [T,N]  V(s_t)
    next_value: torch.Tensor,  # [T,N]  V of the state reached at t+1 (V(final_obs) where the episode ended)
    terminated: torch.Tensor,  # [T,N] bool: true termination, no bootstrap
    done: torch.Tensor,  # [T,N] bool: terminated | truncated, cuts the advantage recursion
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016) with correct time-limit handling.

    ``delta_t = r_t + gamma * (1 - terminated_t) * next_value_t - value_t`` and
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}``.

    A truncated step bootstraps from ``next_value`` (the value of ``final_obs``) but does not carry the
    advantage of the next episode back; a terminated step does neither. Returns ``(advantage, return)``,
    both ``[T,N]``, where ``return = advantage + value`` is the value target.
    """
    if not (reward.shape == value.shape == next_value.shape == terminated.shape == done.shape):
        raise ValueError(
            f"gae expects equal [T,N] shapes, got reward {tuple(reward.shape)}, value {tuple(value.shape)}, "
            f"next_value {tuple(next_value.shape)}, terminated {tuple(terminated.shape)}, done {tuple(done.shape)}"
        )
    not_term = (~terminated).to(reward.dtype)  # [T,N]
    not_done = (~done).to(reward.dtype)  # [T,N]
    delta = reward + gamma * not_term * next_value - value  # [T,N]
    carry = gamma * lam * not_done  # [T,N]
    adv = torch.empty_like(reward)  # [T,N]
    last = torch.zeros_like(reward[0])  # [N]
    for t in range(reward.shape[0] - 1, -1, -1):
        last = delta[t] + carry[t] * last
        adv[t] = last
    return adv, adv + value


def vtrace(
    log_rho: torch.Tensor,  # [T,N]  log pi(a_t|x_t) - log mu(a_t|x_t): target over behaviour policy
    reward: torch.Tensor,  # [T,N]
    value: torch.Tensor,  # [T,N]  V(x_t)
    next_value: torch.Tensor,  # [T,N]  V of the state reached at t+1 (V(final_obs) where the episode ended)
    terminated: torch.Tensor,  # [T,N] bool: true termination, no bootstrap
    done: torch.Tensor,  # [T,N] bool: terminated | truncated, cuts the correction recursion
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018, IMPALA, eqs. 1 and 4).

    With ``rho_t = min(rho_bar, e^log_rho_t)``, ``c_t = lam * min(c_bar, e^log_rho_t)`` and
    ``delta_t = rho_t * (r_t + gamma * (1 - terminated_t) * next_value_t - value_t)``:

    ``v_t - value_t = delta_t + gamma * (1 - done_t) * c_t * (v_{t+1} - value_{t+1})``

    (the paper's recursion; ``lam`` is its Remark-1 variant ``c_t = lam * min(c_bar, ratio)``). The advantage
    of the policy gradient is ``min(pg_rho_bar, ratio_t) * (r_t + gamma * (1 - terminated_t) * v'_t - value_t)``,
    where ``v'_t`` is the V-trace target of the next state: ``v_{t+1}`` inside an episode and ``next_value_t``
    where the episode ended (a truncation bootstraps from the final observation's value, a termination from
    nothing). The last row of the segment uses ``next_value`` (no correction beyond the data).

    On-policy (``log_rho = 0``, bars >= 1) the target is the lambda-return, ``gae(..., lam)``'s return.
    Returns ``(vs, pg_advantage)``, both ``[T,N]``, without gradient (targets).
    """
    shapes = {k: tuple(v.shape) for k, v in dict(log_rho=log_rho, reward=reward, value=value, next_value=next_value,
                                                  terminated=terminated, done=done).items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"vtrace expects equal [T,N] shapes, got {shapes}")
    with torch.no_grad():
        ratio = log_rho.exp()  # [T,N]
        rho = ratio.clamp(max=rho_bar)  # [T,N]
        c = lam * ratio.clamp(max=c_bar)  # [T,N]
        not_term = (~terminated).to(reward.dtype)  # [T,N]
        not_done = (~done).to(reward.dtype)  # [T,N]
        delta = rho * (reward + gamma * not_term * next_value - value)  # [T,N]
        carry = gamma * not_done * c  # [T,N]
        corr = torch.empty_like(reward)  # [T,N]: v_t - value_t
        last = torch.zeros_like(reward[0])  # [N]
        for t in range(reward.shape[0] - 1, -1, -1):
            last = delta[t] + carry[t] * last
            corr[t] = last
        vs = value + corr  # [T,N]
        after = torch.cat([corr[1:], torch.zeros_like(corr[:1])])  # [T,N]: v_{t+1} - value_{t+1}, 0 past the end
        v_next = next_value + not_done * after  # [T,N]
        pg_adv = ratio.clamp(max=pg_rho_bar) * (reward + gamma * not_term * v_next - value)  # [T,N]
    return vs, pg_adv


def domo_advantage(
    log_rho: torch.Tensor,  # [T,N]  log pi(a_t|x_t) - log mu(a_t|x_t)
    reward: torch.Tensor,  # [T,N]
    value: torch.Tensor,  # [T,N]  V(x_t)
    next_value: torch.Tensor,  # [T,N]  V(x_{t+1}) (V(final_obs) where the episode ended)
    vs: torch.Tensor,  # [T,N]  V-trace targets (``vtrace``'s first output)
    terminated: torch.Tensor,  # [T,N] bool
    done: torch.Tensor,  # [T,N] bool
    gamma: float,
    kappa: float,
    pg_rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> torch.Tensor:
    """DoMo-AC's policy-gradient advantage: the off-policy advantage of the kappa-greedy surrogate MDP.

    Derived (the paper's equations were not available; algos/domo_ac.py states the derivation) from the
    kappa-greedy improvement of Efroni et al. 2018: the kappa-greedy policy w.r.t. a value ``v`` is optimal in
    the surrogate MDP with reward ``r + (1 - kappa) * gamma * v(x')`` and discount ``kappa * gamma``. Its advantage,
    with the critic ``V`` as baseline, estimated off-policy with truncated importance weights:

    ``A_t = min(pg_rho_bar, ratio_t) * B_t``,
    ``B_t = d_t + kappa * gamma * (1 - done_t) * min(c_bar, ratio_{t+1}) * B_{t+1}``,
    ``d_t = r_t + gamma * (1 - terminated_t) * ((1 - kappa) * v'_t + kappa * next_value_t) - value_t``,

    where ``v'_t`` is the evaluation target of the next state: ``vs_{t+1}`` inside an episode, ``next_value_t``
    where it ended (as in ``vtrace``). Limits: ``kappa = 0`` is V-trace's policy-gradient advantage exactly;
    on-policy with ``vs`` the Monte Carlo (lambda = 1) targets, ``A_t = G_t - value_t`` for every kappa (the sum
    telescopes); ``kappa = 1`` is the trace-weighted sum of one-step TD errors. The last row of the segment has no
    trace beyond it. Returns ``[T,N]`` without gradient.
    """
    with torch.no_grad():
        ratio = log_rho.exp()  # [T,N]
        not_term = (~terminated).to(reward.dtype)  # [T,N]
        not_done = (~done).to(reward.dtype)  # [T,N]
        after = torch.cat([vs[1:], vs[-1:]])  # [T,N]: vs_{t+1} (last row unused: masked below)
        last_row = torch.zeros_like(not_done)
        last_row[-1] = 1.0
        inside = not_done * (1 - last_row)  # [T,N]: x_{t+1} is in the segment and the episode goes on
        v_next = inside * after + (1 - inside) * next_value  # [T,N]
        d = reward + gamma * not_term * ((1 - kappa) * v_next + kappa * next_value) - value  # [T,N]
        c_next = torch.cat([ratio[1:].clamp(max=c_bar), torch.zeros_like(ratio[:1])])  # [T,N]: c_{t+1}
        carry = kappa * gamma * not_done * c_next  # [T,N]
        B = torch.empty_like(reward)  # [T,N]
        last = torch.zeros_like(reward[0])  # [N]
        for t in range(reward.shape[0] - 1, -1, -1):
            last = d[t] + carry[t] * last
            B[t] = last
        return ratio.clamp(max=pg_rho_bar) * B


def discounted_returns(
    reward: torch.Tensor, terminated: torch.Tensor, done: torch.Tensor, bootstrap: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Monte-Carlo return-to-go per step, ``[T,N]``; ``bootstrap [T,N]`` is added (discounted) at truncations.

    ``G_t = r_t + gamma * ((1 - done_t) * G_{t+1} + (done_t & ~terminated_t) * bootstrap_t)``; the last row
    bootstraps from ``bootstrap[-1]`` unless it terminated.
    """
    not_done = (~done).to(reward.dtype)  # [T,N]
    trunc = (done & ~terminated).to(reward.dtype)  # [T,N]
    out = torch.empty_like(reward)  # [T,N]
    nxt = bootstrap[-1] * (~terminated[-1]).to(reward.dtype)  # [N]
    for t in range(reward.shape[0] - 1, -1, -1):
        if t < reward.shape[0] - 1:
            nxt = not_done[t] * out[t + 1] + trunc[t] * bootstrap[t]
        out[t] = reward[t] + gamma * nxt
    return out


# torch's fused multi-tensor lerp has no public name (torch.optim calls it the same way) and torch's stubs do not
# export it, so it is looked up once here with its signature spelled out: the same function object as before.
_foreach_lerp_: Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor], float], None] = vars(torch)["_foreach_lerp_"]


@torch.no_grad()
def polyak_(target: Sequence[torch.Tensor], source: Sequence[torch.Tensor], tau: float) -> None:
    """In place ``target <- (1 - tau) * target + tau * source`` for lists of tensors (fused lerp)."""
    _foreach_lerp_(target, source, tau)


def group_relative_advantages(
    reward: torch.Tensor,  # [T,N] undiscounted reward of each step (or chunk)
    ended: torch.Tensor,  # [T,N] bool: the env's episode ended at this step
    group_size: int,
) -> torch.Tensor:
    """Outcome advantages against the other members of a group of envs that replay the same episodes
    (GRPO-style, Shao et al. 2024, without the per-group standard deviation).

    Envs ``[g*G, (g+1)*G)`` form group ``g`` and must end their episodes at the same steps, so that their k-th
    episodes in the window started from the same initial state. Every step of an episode gets that episode's
    return minus the mean return of the group's k-th episodes. Raises ``ValueError`` when an episode is still
    running at the window's end or a group's episodes end at different steps. Returns ``[T,N]``.
    """
    T, N = reward.shape
    if ended.shape != reward.shape or group_size < 1 or N % group_size:
        raise ValueError(f"group_relative_advantages expects [T,N] reward and ended with N a multiple of the group "
                         f"size, got reward {tuple(reward.shape)}, ended {tuple(ended.shape)}, group {group_size}")
    if not bool(ended[-1].all()):
        raise ValueError("group_relative_advantages needs whole episodes: an episode is still running at the end of "
                         "the window")
    grouped = ended.view(T, N // group_size, group_size)  # [T,Gn,G]
    if not bool((grouped == grouped[..., :1]).all()):
        raise ValueError("group_relative_advantages needs the envs of a group to end their episodes at the same steps")
    episode = torch.flip(torch.cumsum(torch.flip(ended.long(), [0]), 0), [0])  # [T,N] episodes ending at or after t
    returns = torch.zeros(int(episode.max().item()) + 1, N, dtype=reward.dtype, device=reward.device)  # [K,N]
    returns.scatter_add_(0, episode, reward)
    baseline = returns.view(-1, N // group_size, group_size).mean(-1, keepdim=True)  # [K,Gn,1]
    centred = (returns.view(-1, N // group_size, group_size) - baseline).view(-1, N)  # [K,N]
    return centred.gather(0, episode)


def successful_episode_steps(
    ended: torch.Tensor,  # [T,N] bool: the env's episode ended at this step
    success: torch.Tensor,  # [T,N] bool: ... and succeeded (read where ended)
    fresh: torch.Tensor,  # [N] bool: the env's episode began at the window's first step
) -> torch.Tensor:
    """``[T,N]`` bool: the steps of episodes that lie wholly inside the window and succeeded (for self-imitation
    of a policy's own successes). An episode still running at the window's end, or begun before it, is left out."""
    T = ended.shape[0]
    keep = torch.zeros_like(ended)
    outcome = torch.zeros_like(fresh)  # [N] outcome of the episode running at step t (False: not ended in window)
    for t in range(T - 1, -1, -1):
        outcome = torch.where(ended[t], success[t], outcome)
        keep[t] = outcome
    before = torch.cumsum(ended.long(), 0) - ended.long()  # [T,N] episodes ended before step t
    return keep & ((before > 0) | fresh[None])


def nstep_return(
    reward: torch.Tensor,  # [B,n] rewards of the chain's steps: j = 0 is the sampled transition, j the env's j-th next
    terminated: torch.Tensor,  # [B,n] bool: true termination at step j
    truncated: torch.Tensor,  # [B,n] bool: time-limit cut at step j
    valid: torch.Tensor,  # [B,n] bool: step j is stored (False past the newest step of the env); valid[:, 0] all True
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n-step returns of transition chains (Sutton & Barto ch. 7; FastTD3's n = 3), correct at episode ends.

    A chain stops at its last step ``L``: the first step that ends an episode (terminated or truncated), else the
    last valid step (at most ``n - 1``). With ``j = 0..L``::

        R = sum_j gamma^j r_j,    discount = gamma^(L+1),    y = R + discount * (1 - terminated_L) * V(s'_L)

    where ``s'_L`` is step L's next observation (``final_obs`` at an episode end). A truncated step ends the chain
    and is bootstrapped from (the return never runs into the next episode); a terminated one is not. A chain cut
    short by the newest stored step is bootstrapped like a shorter n. Returns ``(R [B], L [B] int64,
    discount [B])``; with n = 1 it is ``(r, 0, gamma)``, the one-step transition.
    """
    B, n = reward.shape
    if terminated.shape != (B, n) or truncated.shape != (B, n) or valid.shape != (B, n):
        raise ValueError(f"nstep_return expects equal [B,n] shapes, got reward {tuple(reward.shape)}, terminated "
                         f"{tuple(terminated.shape)}, truncated {tuple(truncated.shape)}, valid {tuple(valid.shape)}")
    ends = terminated | truncated  # [B,n]
    ends = torch.cat([ends[:, :-1] | ~valid[:, 1:], torch.ones_like(ends[:, :1])], 1)  # [B,n] the chain stops here
    last = ends.to(torch.uint8).argmax(1)  # [B] first stop (argmax returns the first maximum)
    steps = torch.arange(n, device=reward.device)  # [n]
    powers = gamma ** steps.to(reward.dtype)  # [n]
    keep = (steps.unsqueeze(0) <= last.unsqueeze(1)).to(reward.dtype)  # [B,n]
    ret = (reward * keep * powers).sum(1)  # [B]
    return ret, last, gamma ** (last + 1).to(reward.dtype)
