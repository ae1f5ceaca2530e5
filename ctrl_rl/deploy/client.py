"""The robot side of ``ctrl-rl serve``: the policy of ``ControlLoop`` over the network.

``ctrl-rl deploy EXPORT --server HOST:PORT --sim ENV`` runs the runtime's loop (simulator, safety filter,
watchdog, fixed rate) in its own process with one of these in place of ``OnnxPolicy``:

- ``RemotePolicy`` (an export of one action per tick: MLP, image, recurrent): one ``Act`` call per tick, at
  batch 1, with the loop's feed (the loop keeps the recurrent state).
- ``RemoteChunks`` (an export of action chunks, a VLA): asks ahead, as LeRobot's asynchronous inference does.
  Each answer is the chunk for the observation of the tick it was asked at; its first ``execute_steps`` actions are
  that tick's and the next ones'. They go into a queue keyed by tick, where a newer chunk's action replaces an
  older one for the same tick, and ticks already past are dropped. When at most ``ask_ahead`` x ``execute_steps``
  actions are left, the tick's observation is sent for the next chunk while the queue keeps the robot moving, so
  inference overlaps execution. Only when the queue is empty does a tick wait, at most ``timeout``.

Faults, the same for both:

- **Lost server**: the channel's connectivity (watched through gRPC's callback) leaves READY, or a call fails with
  UNAVAILABLE. That tick raises ``PolicyUnavailable``: the loop commands the safe action (``robot.stop()``) in that
  tick and logs it, a chunk queue is emptied (no open-loop actions from a server that is gone), and every later
  tick probes with ``Info`` (fast while the port refuses; the channel re-dials every 0.1-0.5 s) and holds until the
  server answers and serves the same export (``policy.json``'s sha256), then the loop goes on.
- **Late answer**: a call not answered within ``timeout`` (default one control period) raises
  ``PolicyUnavailable(late=True)``: the tick holds and counts as a missed deadline, so the loop's watchdog stops the
  robot after ``--max-misses`` in a row.
- **Refusal** (UNAUTHENTICATED, INVALID_ARGUMENT, INTERNAL, another export after a restart): ``PolicyRefused``, a
  safe stop.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import numpy as np

from ctrl_rl.deploy import wire
from ctrl_rl.deploy.runtime import PolicyRefused, PolicyUnavailable
from ctrl_rl.deploy.server import SERVICE, TOKEN_ENV
from ctrl_rl.errors import UserInputError

RECONNECT_BACKOFF_MS = (100, 500)
"""The channel re-dials a lost server after 100 ms, backing off to 500 ms (gRPC's defaults: 1 s to 120 s)."""
MAX_ANSWER = 64 << 20
"""Largest answer the client accepts (bytes)."""


class PolicyClient:
    """A channel to ``ctrl-rl serve`` with the token, ``Info`` and ``Act`` (blocking or as a future), whether the
    connection is up, and the round-trip times of the answered calls."""

    def __init__(self, target: str, token: str | None = None):
        import grpc

        self._grpc = grpc
        self.target = target
        lo, hi = RECONNECT_BACKOFF_MS
        self.channel = grpc.insecure_channel(target, options=[
            ("grpc.initial_reconnect_backoff_ms", lo), ("grpc.min_reconnect_backoff_ms", lo),
            ("grpc.max_reconnect_backoff_ms", hi), ("grpc.max_receive_message_length", MAX_ANSWER),
            ("grpc.enable_retries", 0)])
        self.state: Any = None
        self.channel.subscribe(self._on_state, try_to_connect=True)
        self._info = self.channel.unary_unary(f"/{SERVICE}/Info")
        self._act = self.channel.unary_unary(f"/{SERVICE}/Act")
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._ids = itertools.count(1)
        self.rtt_ms: list[float] = []
        self.server_ms: list[float] = []

    def _on_state(self, state) -> None:
        self.state = state

    @property
    def ready(self) -> bool:
        return self.state == self._grpc.ChannelConnectivity.READY

    def info(self, timeout: float, wait_for_ready: bool = False) -> wire.InfoResponse:
        raw = self._info(b"", timeout=timeout, metadata=self.metadata, wait_for_ready=wait_for_ready)
        return wire.decode(wire.InfoResponse, raw)

    def request(self, feed: dict[str, np.ndarray]) -> bytes:
        return wire.encode(wire.ActRequest([wire.to_tensor(n, a) for n, a in feed.items()], next(self._ids)))

    def answer(self, raw: bytes, sent: float, done: float | None = None) -> list[np.ndarray]:
        """The outputs of an answer; ``done``: when it arrived (default now), for the round-trip time."""
        self.rtt_ms.append(((done if done is not None else time.perf_counter()) - sent) * 1e3)
        msg = wire.decode(wire.ActResponse, raw)
        self.server_ms.append(msg.server_ms)
        return [wire.to_array(t) for t in msg.outputs]

    def act(self, feed: dict[str, np.ndarray], timeout: float) -> list[np.ndarray]:
        sent = time.perf_counter()
        return self.answer(self._act(self.request(feed), timeout=timeout, metadata=self.metadata), sent)

    def act_future(self, feed: dict[str, np.ndarray], timeout: float) -> tuple[Any, float, list[float]]:
        """The call as a future, when it was sent, and a list that gets the time it completed."""
        sent, done = time.perf_counter(), []
        future = self._act.future(self.request(feed), timeout=timeout, metadata=self.metadata)
        future.add_done_callback(lambda _: done.append(time.perf_counter()))
        return future, sent, done

    def stats(self) -> dict:
        def pct(x, q):
            return float(np.percentile(x, q)) if x else None

        return {"address": self.target, "calls": len(self.rtt_ms), "round_trip_ms_p50": pct(self.rtt_ms, 50),
                "round_trip_ms_p99": pct(self.rtt_ms, 99), "server_ms_p50": pct(self.server_ms, 50)}

    def close(self) -> None:
        self.channel.unsubscribe(self._on_state)
        self.channel.close()


class _Remote:
    """What both remote policies share: the export they expect, the deadline, loss and reconnection."""

    def __init__(self, client: PolicyClient, sha256: str, timeout: float):
        self.client, self.sha256, self.timeout = client, sha256, timeout
        self.lost = False

    def _failed(self, e: Exception) -> Exception:
        """The loop's exception for a failed call."""
        grpc = self.client._grpc
        code = e.code() if isinstance(e, grpc.RpcError) else None  # type: ignore[attr-defined]
        details = (e.details() if isinstance(e, grpc.RpcError) else str(e)) or ""  # type: ignore[attr-defined]
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return PolicyUnavailable(f"no answer from {self.client.target} within {self.timeout * 1e3:.0f} ms",
                                     late=True)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            return self._lose(f"{code.name}: {details[:200]}")
        return PolicyRefused(f"the policy server at {self.client.target} refused the call with "
                             f"{code.name if code else type(e).__name__}: {details[:300]}")

    def _lose(self, why: str) -> PolicyUnavailable:
        self.lost = True
        self.on_lost()
        return PolicyUnavailable(f"the policy server at {self.client.target} is unreachable ({why})")

    def on_lost(self) -> None:
        pass

    def ensure(self) -> None:
        """Raise ``PolicyUnavailable`` at the first tick the connection is down and at every tick until the server
        answers ``Info`` again with the same export (``PolicyRefused`` for another export)."""
        if not self.lost:
            if not self.client.ready:
                raise self._lose(f"connection {getattr(self.client.state, 'name', self.client.state)}")
            return
        grpc = self.client._grpc
        try:
            info = self.client.info(self.timeout)
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):  # type: ignore[attr-defined]
                raise PolicyUnavailable(f"the policy server at {self.client.target} is still unreachable") from None
            raise self._failed(e) from None
        if info.export_sha256 != self.sha256:
            raise PolicyRefused(f"the policy server at {self.client.target} came back serving another export "
                                f"(policy.json sha256 {info.export_sha256[:12]}, expected {self.sha256[:12]})")
        self.lost = False


class RemotePolicy(_Remote):
    """``ControlLoop``'s policy callable over the network: one ``Act`` per tick (module docstring)."""

    def __call__(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.ensure()
        try:
            return self.client.act(feed, self.timeout)
        except self.client._grpc.RpcError as e:
            raise self._failed(e) from None


class RemoteChunks(_Remote):
    """A chunk export over the network, asking ahead (module docstring); the runtime's ``ActionStream``."""

    def __init__(self, client: PolicyClient, sha256: str, timeout: float, execute_steps: int, ask_ahead: float = 0.5):
        super().__init__(client, sha256, timeout)
        self.execute = execute_steps
        self.ask_at = int(round(ask_ahead * execute_steps))  # 0: only when the queue is empty (no overlap)
        self.queue: dict[int, np.ndarray] = {}  # tick -> action [A]
        self.pending: tuple[Any, float, list[float], int] | None = None  # (future, sent, done, tick asked at)
        self.chunks = self.replaced = self.late_chunks = self.waited = 0

    def reset(self) -> None:
        """An episode starts: no action of the last one may run."""
        self.queue.clear()
        self._drop_pending()

    def on_lost(self) -> None:
        self.reset()

    def _drop_pending(self) -> None:
        if self.pending is not None:
            self.pending[0].cancel()
            self.pending = None

    def _merge(self, tick: int) -> None:
        """Take the pending answer into the queue (its chunk starts at the tick it was asked at)."""
        assert self.pending is not None
        future, sent, done, asked = self.pending
        self.pending = None
        try:
            chunk = self.client.answer(future.result(), sent, done[0] if done else None)[0][0]  # [H,A]
        except self.client._grpc.RpcError as e:
            raise self._failed(e) from None
        self.chunks += 1
        for k, a in enumerate(chunk[: self.execute]):
            t = asked + k
            if t >= tick:
                self.replaced += t in self.queue
                self.queue[t] = np.asarray(a)

    def next_action(self, feed, tick: int) -> np.ndarray:
        self.ensure()
        for t in [t for t in self.queue if t < tick]:
            del self.queue[t]
        if self.pending is not None and self.pending[0].done():
            try:
                self._merge(tick)
            except PolicyUnavailable as e:
                if not e.late or tick not in self.queue:
                    raise
                self.late_chunks += 1  # late, but the queue still covers this tick: ask again
        if self.pending is None and len(self.queue) <= self.ask_at:
            # due before the queue runs dry: one timeout (a control period) per queued action and this tick
            due = self.timeout * (len(self.queue) + 1)
            self.pending = (*self.client.act_future(feed(), due), tick)
        if tick not in self.queue:  # dry: wait for the answer, at most the deadline
            assert self.pending is not None
            self.waited += 1
            try:
                self.pending[0].result(timeout=self.timeout)
            except self.client._grpc.FutureTimeoutError:
                raise PolicyUnavailable(f"no chunk from {self.client.target} within {self.timeout * 1e3:.0f} ms",
                                        late=True) from None
            except Exception:
                pass  # the call's own error comes out of _merge
            self._merge(tick)
            if tick not in self.queue:  # an answer for an older tick whose actions are all past
                raise PolicyUnavailable("the chunk that came back was for ticks already past", late=True)
        return self.queue.pop(tick)

    def stats(self) -> dict:
        return {"chunks": self.chunks, "actions_replaced": self.replaced, "late_chunks": self.late_chunks,
                "waited": self.waited, "ask_at": self.ask_at}


def connect(target: str, export_sha256: str, token: str | None, connect_timeout: float = 10.0
            ) -> tuple[PolicyClient, wire.InfoResponse]:
    """A client to ``target`` that has checked the server answers, accepts the token and serves the export with
    this ``policy.json`` (its sha256); ``UserInputError`` in one sentence otherwise."""
    try:
        import grpc
    except ImportError as e:
        raise UserInputError(f"--server needs the package grpcio ({e}): expected it installed "
                             "(pip install 'ctrl-rl[serve]')") from None
    if ":" not in target or not target.rsplit(":", 1)[1].isdigit():
        raise UserInputError(f"invalid --server {target!r}: expected HOST:PORT of a `ctrl-rl serve`")
    token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
    client = PolicyClient(target, token)
    try:
        info = client.info(connect_timeout, wait_for_ready=True)
    except grpc.RpcError as e:
        client.close()
        code = e.code()  # type: ignore[attr-defined]
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise UserInputError(f"the policy server at {target} refused the call ({e.details()}): expected --token "  # type: ignore[attr-defined]
                                 f"(or ${TOKEN_ENV}) with the server's token") from None
        raise UserInputError(f"no policy server answered at {target} within {connect_timeout:g} s ({code.name}): "
                             "expected `ctrl-rl serve EXPORT` listening there") from None
    if info.export_sha256 != export_sha256:
        client.close()
        raise UserInputError(f"the policy server at {target} serves another export (policy.json sha256 "
                             f"{info.export_sha256[:12]}, this one {export_sha256[:12]}): expected the export "
                             "given to deploy")
    end = time.monotonic() + 1.0
    while not client.ready and time.monotonic() < end:  # the connectivity callback runs on gRPC's thread
        time.sleep(0.001)
    return client, info
