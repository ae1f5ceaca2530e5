"""The one worker pool: K processes, each owning one object built inside the worker, called in lockstep.

``WorkerPool(factory, args)`` starts one process per entry of ``args``; worker k builds ``factory(*args[k])`` and
then answers calls. ``call_all(method, per_worker)`` sends every worker its call before reading any answer, so the
workers run in parallel, then returns their results in worker order. A worker answers each call with ``("ok",
result)`` or ``("error", (exception, traceback))``; the parent raises the first error after every answer is in:
a ``UserInputError`` as it is (a bad env id found while building a worker's envs reaches the user as one sentence),
anything else as ``WorkerError`` with the worker's traceback. A worker that dies is an error too.

Results travel pickled through one pipe per worker (about 0.2 ms for a 180x320 image: small next to producing it).
Users: the manipulation envs' ``workers=K`` (``envs/manipulation``) and D4RL-protocol collection
(``datagen/generate``). The actor-learner's process backend is a different shape (actors that never wait for the
learner, a shared-memory weight buffer and a queue) and keeps its own start-up; it shares ``stop_processes``.

Start method: ``spawn`` by default (a fork copies the parent's OpenGL context and torch thread pools, which are not
fork-safe); ``fork`` where the worker runs no torch or GL code and the caller may be a script without a
``__main__`` guard (a spawned worker re-imports it).
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ctrl_rl.errors import UserInputError

if TYPE_CHECKING:
    from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext


class WorkerError(RuntimeError):
    """A worker process failed (its traceback is in the message) or exited unexpectedly."""


def _serve(conn: Any, factory: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """A worker's main loop: build the object (it has a ``close()``), answer ``(method, args)`` calls until ``None``
    or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends its workers
    obj = None
    try:
        obj = factory(*args)
        conn.send(("ok", None))
        while True:
            msg = conn.recv()
            if msg is None:
                conn.send(("ok", None))
                break
            method, call_args = msg
            conn.send(("ok", getattr(obj, method)(*call_args)))
    except (EOFError, KeyboardInterrupt):
        pass
    except BaseException as e:  # noqa: BLE001 -- every failure goes to the parent, which raises it
        try:
            conn.send(("error", (_picklable(e), traceback.format_exc())))
        except (BrokenPipeError, OSError):
            pass
    finally:
        if obj is not None:
            obj.close()
        conn.close()


def _picklable(e: BaseException) -> BaseException | None:
    """``e`` if it survives pickling (most exceptions do), else None (the traceback text still reaches the parent)."""
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return None


def stop_processes(procs: Sequence[Any], timeout: float = 5.0) -> None:
    """Join every process for up to ``timeout`` seconds each, then terminate those still alive."""
    for p in procs:
        p.join(timeout=timeout)
        if p.is_alive():
            p.terminate()


def _context(name: str) -> SpawnContext | ForkContext | ForkServerContext:
    """The context of start method ``name`` where this platform has it, else spawn's. Each asked for by its
    literal name, so that the checker sees a concrete context (``get_context(str)`` is typed ``BaseContext``,
    which has no ``Process``)."""
    if name in mp.get_all_start_methods():
        if name == "fork":
            return mp.get_context("fork")
        if name == "forkserver":
            return mp.get_context("forkserver")
    return mp.get_context("spawn")


class WorkerPool:
    """One worker process per entry of ``args``, each owning ``factory(*args[k])``; see the module docstring."""

    def __init__(self, factory: Callable[..., Any], args: Sequence[tuple[Any, ...]], *, start_method: str = "spawn",
                 name: str = "ctrl_rl-worker") -> None:
        ctx = _context(start_method)
        self.name = name
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        try:
            for k, a in enumerate(args):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(child, factory, tuple(a)), daemon=True, name=f"{name}-{k}")
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
            self._gather()  # every worker built its object (or the first error is raised here)
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self._conns)

    def _gather(self) -> list[Any]:
        out: list[Any] = []
        error: tuple[BaseException | None, str] | None = None
        for conn in self._conns:
            try:
                status, result = conn.recv()
            except (EOFError, OSError):
                status, result = "error", (None, f"a {self.name} process exited unexpectedly")
            if status == "error" and error is None:
                error = result
            out.append(result)
        if error is not None:
            exc, text = error
            if isinstance(exc, UserInputError):
                raise exc
            raise WorkerError(f"{self.name}: a worker failed:\n{text}")
        return out

    def call_all(self, method: str, per_worker: Sequence[tuple[Any, ...]] | None = None) -> list[Any]:
        """``method(*per_worker[k])`` on every worker's object (no arguments when None), results in worker order."""
        for k, conn in enumerate(self._conns):
            conn.send((method, () if per_worker is None else tuple(per_worker[k])))
        return self._gather()

    def close(self) -> None:
        """Ask every worker to close its object and exit; terminate those that do not within 5 s."""
        for conn in self._conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for conn in self._conns:
            try:
                if conn.poll(5.0):
                    conn.recv()
            except (EOFError, OSError):
                pass
            conn.close()
        stop_processes(self._procs)
        self._conns, self._procs = [], []


class LocalWorkers:
    """``WorkerPool``'s interface with every object built and called in this process (one worker, or a test that
    must not start processes): the same results, no pickling, no parallelism."""

    def __init__(self, factory: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> None:
        self._objs: list[Any] = []
        try:
            for a in args:
                self._objs.append(factory(*a))
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self._objs)

    def call_all(self, method: str, per_worker: Sequence[tuple[Any, ...]] | None = None) -> list[Any]:
        return [getattr(o, method)(*(() if per_worker is None else per_worker[k])) for k, o in enumerate(self._objs)]

    def close(self) -> None:
        for o in self._objs:
            o.close()
        self._objs = []
