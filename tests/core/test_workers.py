"""The one worker pool: objects built in worker processes and called in lockstep, errors raised in the parent."""

import os

import pytest

from ctrl_rl.core.workers import LocalWorkers, WorkerError, WorkerPool
from ctrl_rl.errors import UserInputError


class Counter:
    """A toy worker object: adds to its own total; fails on request."""

    def __init__(self, start: int, fail_on_build: str = ""):
        if fail_on_build == "user":
            raise UserInputError("unknown thing 'x': expected 'y'")
        if fail_on_build == "bug":
            raise ValueError("boom in the constructor")
        self.total = start

    def add(self, k: int) -> tuple[int, int]:
        self.total += k
        return self.total, os.getpid()

    def fail(self) -> None:
        raise KeyError("broken")

    def die(self) -> None:
        os._exit(3)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_calls_run_in_every_worker_and_answer_in_worker_order(start_method):
    pool = WorkerPool(Counter, [(0,), (100,), (1000,)], start_method=start_method, name="counter")
    try:
        out = pool.call_all("add", [(1,), (2,), (3,)])
        assert [t for t, _ in out] == [1, 102, 1003]
        assert len({pid for _, pid in out} | {os.getpid()}) == 4  # three processes besides this one
        assert [t for t, _ in pool.call_all("add", [(1,)] * 3)] == [2, 103, 1004]  # state stays in the workers
    finally:
        pool.close()
    pool.close()  # closing twice is harmless


def test_local_workers_give_the_same_results_in_this_process():
    local = LocalWorkers(Counter, [(0,), (100,)])
    out = local.call_all("add", [(1,), (2,)])
    assert [t for t, _ in out] == [1, 102] and {pid for _, pid in out} == {os.getpid()}
    local.close()


def test_a_user_input_error_in_a_worker_reaches_the_parent_as_it_is():
    with pytest.raises(UserInputError, match="unknown thing 'x'"):
        WorkerPool(Counter, [(0,), (0, "user")], start_method="fork")


def test_other_failures_raise_a_worker_error_with_the_traceback():
    with pytest.raises(WorkerError, match="boom in the constructor"):
        WorkerPool(Counter, [(0, "bug")], start_method="fork")
    pool = WorkerPool(Counter, [(0,), (0,)], start_method="fork", name="counter")
    try:
        with pytest.raises(WorkerError, match="KeyError: 'broken'"):
            pool.call_all("fail")
    finally:
        pool.close()


def test_a_worker_that_dies_is_an_error():
    pool = WorkerPool(Counter, [(0,)], start_method="fork", name="counter")
    try:
        with pytest.raises(WorkerError, match="counter process exited unexpectedly"):
            pool.call_all("die")
    finally:
        pool.close()
