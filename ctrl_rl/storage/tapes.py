"""Episode tapes: a FIFO buffer of whole episodes for recurrent agents (NeuBay, docs/algorithms/neubay.md#the-loop).

Shape letters: C capacity in transitions, R rows added, T rows of a batch, P tapes, O obs dim, A action dim.

A *tape* is one episode as the agent saw it: a real history prefix (rows of an offline trajectory,
``real=True``) followed by its imagined continuation (``real=False``). Every row is one transition
``(obs, action, reward, next_obs, terminated, truncated, real)``; ``first`` marks the row a tape starts with.
Rows of one tape are consecutive, in time order, so a recurrent encoder can read a tape front to back.

``TapeBuffer`` keeps the newest tapes: a ring of ``capacity`` rows, filled FIFO by transitions; when a new
tape does not fit, the oldest *whole* tapes are dropped (never part of one). Storage grows on demand up to
``capacity`` (doubling), so the paper's 40M-transition capacity costs only the rows actually written.

Sampling (NeuBay's ``TapeBuffer.sample``): tapes drawn uniformly at random (each tape equally likely,
whatever its length), *concatenated* in draw order until they hold at least ``batch`` transitions, then cut to
exactly ``batch`` rows (the last tape drawn is usually cut short; its last kept row still carries its own
``next_obs``, so nothing is lost but the rows cut). No padding: the batch is one flat sequence of ``T = batch``
rows whose ``first`` flags tell where the recurrence restarts. The generator's consumption does not depend
on the buffer's content (``batch`` draws every time), so a resumed run samples what an uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ctrl_rl.errors import UserInputError

_ROW_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "real")


@dataclass
class TapeBatch:
    """Rows of whole (or, in a sampled batch, a cut last) tapes, concatenated in order."""

    obs: torch.Tensor  # [T,O] float32
    action: torch.Tensor  # [T,A] float32
    reward: torch.Tensor  # [T] float32
    next_obs: torch.Tensor  # [T,O] float32: the state the step reached (final observation where a tape ends)
    terminated: torch.Tensor  # [T] bool: true termination (no bootstrap)
    truncated: torch.Tensor  # [T] bool: time limit, model uncertainty, or end of a dataset trajectory
    real: torch.Tensor  # [T] bool: a row of the offline data (history prefix), else imagined
    first: torch.Tensor  # [T] bool: the first row of a tape (first[0] is True)
    num_tapes: int | None = None
    """Number of tapes in the rows (= first.sum()); known on the host when the buffer samples, else computed."""

    def __post_init__(self) -> None:
        T = self.reward.shape[0]
        for f in _ROW_FIELDS + ("first",):
            v = getattr(self, f)
            assert v.shape[0] == T, f"TapeBatch.{f} has {v.shape[0]} rows, reward {T}"
        assert self.obs.dim() == 2 and self.next_obs.shape == self.obs.shape and self.action.dim() == 2

    def __len__(self) -> int:
        return self.reward.shape[0]

    def tapes(self) -> int:
        """P, the number of tapes (one host sync when it was not given)."""
        if self.num_tapes is None:
            self.num_tapes = int(self.first.sum())
        return self.num_tapes


class TapeBuffer:
    """FIFO ring of whole episode tapes (see the module docstring).

    Args:
        capacity: C, transitions kept at most (NeuBay: 40M).
        obs_dim: O; action_dim: A.
        device: where every row lives (the training device).
    """

    def __init__(self, capacity: int, obs_dim: int, action_dim: int, device: torch.device | str = "cpu"):
        if not isinstance(capacity, int) or capacity < 1:
            raise UserInputError(f"tape buffer capacity {capacity!r} is invalid: "
                                 "expected a positive number of transitions")
        self.capacity, self.obs_dim, self.action_dim = capacity, int(obs_dim), int(action_dim)
        self.device = torch.device(device)
        self._alloc(0)
        # [P] first row of every live tape, oldest first
        self.starts = torch.zeros(0, dtype=torch.int64, device=self.device)
        self.lengths = torch.zeros(0, dtype=torch.int64, device=self.device)  # [P] rows of every live tape
        self.ptr = 0  # next row to write (ring position)
        self.size = 0  # rows held by live tapes
        self.added = 0  # transitions ever added
        self.dropped = 0  # tapes ever dropped to make room

    def _alloc(self, rows: int) -> None:
        O, A, dev = self.obs_dim, self.action_dim, self.device
        self.obs = torch.zeros(rows, O, device=dev)  # [C',O]
        self.action = torch.zeros(rows, A, device=dev)  # [C',A]
        self.reward = torch.zeros(rows, device=dev)  # [C']
        self.next_obs = torch.zeros(rows, O, device=dev)  # [C',O]
        self.terminated = torch.zeros(rows, dtype=torch.bool, device=dev)  # [C']
        self.truncated = torch.zeros(rows, dtype=torch.bool, device=dev)  # [C']
        self.real = torch.zeros(rows, dtype=torch.bool, device=dev)  # [C']

    @property
    def allocated(self) -> int:
        return self.reward.shape[0]

    def _grow(self, rows: int) -> None:
        old = {f: getattr(self, f) for f in _ROW_FIELDS}
        n = self.allocated
        self._alloc(rows)
        for f, v in old.items():
            getattr(self, f)[:n] = v

    def __len__(self) -> int:
        return self.size

    @property
    def num_tapes(self) -> int:
        return self.lengths.shape[0]

    def add(self, tapes: TapeBatch) -> int:
        """Append whole tapes (rows in order, ``first`` marking starts); drops the oldest tapes to make room.
        Returns the transitions written (a collection larger than the capacity keeps its newest tapes only)."""
        R = len(tapes)
        if R == 0:
            return 0
        if tapes.obs.shape[1] != self.obs_dim or tapes.action.shape[1] != self.action_dim:
            raise UserInputError(f"tapes of obs dim {tapes.obs.shape[1]} and action dim {tapes.action.shape[1]} do not "
                                 "fit "
                                 f"this tape buffer: expected {self.obs_dim} and {self.action_dim}")
        first = tapes.first.to(self.device)
        new_starts = first.nonzero().squeeze(1)  # [P] (host sync: sizes the tables)
        if new_starts.numel() == 0 or int(new_starts[0]) != 0:
            raise UserInputError("tapes added to the tape buffer must start with a row marked first: "
                                 "expected whole tapes")
        new_len = torch.diff(new_starts, append=torch.tensor([R], device=self.device))  # [P]
        lens = new_len.tolist()
        if max(lens) > self.capacity:
            raise UserInputError(f"a tape of {max(lens)} transitions does not fit a tape buffer of {self.capacity}: "
                                 "expected "
                                 "a larger buffer capacity (--buffer-transitions)")
        skip, total = 0, R  # the newest tapes of this call that fit on their own
        while total > self.capacity:
            total -= lens[skip]
            skip += 1
        row0 = int(new_starts[skip])
        n = R - row0
        need = self.size + n - self.capacity
        if need > 0:  # drop the oldest whole tapes
            k = int(torch.searchsorted(self.lengths.cumsum(0), torch.tensor(need, device=self.device))) + 1
            self.size -= int(self.lengths[:k].sum())
            self.starts, self.lengths = self.starts[k:], self.lengths[k:]
            self.dropped += k
        if self.ptr + n > self.allocated and self.allocated < self.capacity:
            self._grow(min(self.capacity, max(2 * self.allocated, self.ptr + n, 1024)))
        idx = (self.ptr + torch.arange(n, device=self.device)) % self.capacity  # [n] ring rows
        for f in _ROW_FIELDS:
            getattr(self, f)[idx] = getattr(tapes, f)[row0:].to(self.device, getattr(self, f).dtype)
        self.starts = torch.cat([self.starts, (self.ptr + new_starts[skip:] - row0) % self.capacity])
        self.lengths = torch.cat([self.lengths, new_len[skip:]])
        self.ptr = (self.ptr + n) % self.capacity
        self.size += n
        self.added += n
        return n

    def sample(self, batch: int, generator: torch.Generator | None) -> TapeBatch:
        """Exactly ``batch`` rows of uniformly drawn tapes, concatenated (module docstring). One host sync."""
        P = self.num_tapes
        if P == 0:
            raise UserInputError("the tape buffer is empty: expected tapes to be added before sampling")
        # [batch] tape ids (enough: >= 1 row each)
        draw = torch.randint(P, (batch,), generator=generator, device=self.device)
        lens = self.lengths[draw]  # [batch]
        cum = lens.cumsum(0)  # [batch]
        k = int(torch.searchsorted(cum, torch.tensor(batch, device=self.device))) + 1  # tapes used (host sync)
        cum, lens, sel = cum[:k], lens[:k], draw[:k]  # [k]
        rows = torch.arange(batch, device=self.device)  # [T]
        tape = torch.searchsorted(cum, rows, right=True)  # [T] which drawn tape each row belongs to
        within = rows - (cum - lens)[tape]  # [T] position inside its tape
        idx = (self.starts[sel][tape] + within) % self.capacity  # [T] ring rows
        return TapeBatch(*(getattr(self, f)[idx] for f in _ROW_FIELDS), first=within == 0, num_tapes=k)

    def state_dict(self) -> dict:
        """Everything to continue exactly: the rows written so far (not the unused capacity) and the tape table."""
        n = self.allocated
        return {"capacity": self.capacity, "obs_dim": self.obs_dim, "action_dim": self.action_dim,
                **{f: getattr(self, f)[:n].clone() for f in _ROW_FIELDS},
                "starts": self.starts.clone(), "lengths": self.lengths.clone(), "ptr": self.ptr, "size": self.size,
                "added": self.added, "dropped": self.dropped}

    def load_state_dict(self, state: dict) -> None:
        dims = (state["capacity"], state["obs_dim"], state["action_dim"])
        if dims != (self.capacity, self.obs_dim, self.action_dim):
            raise ValueError(f"tape buffer state of (capacity, obs dim, action dim) {dims} does not fit "
                             f"{(self.capacity, self.obs_dim, self.action_dim)}")
        self._alloc(state["reward"].shape[0])
        for f in _ROW_FIELDS:
            getattr(self, f).copy_(state[f])
        self.starts = state["starts"].to(self.device, torch.int64).clone()
        self.lengths = state["lengths"].to(self.device, torch.int64).clone()
        self.ptr, self.size, self.added, self.dropped = (int(state[k]) for k in ("ptr", "size", "added", "dropped"))


__all__ = ["TapeBatch", "TapeBuffer"]
