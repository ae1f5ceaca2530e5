"""Run directories: checks before a run writes anything, an exclusive lock, and restart of a run that was
killed before its first checkpoint.

The sequence ``train`` follows (the loop or the CLI calls these)::

    restartable = check_new_run_dir(path)          # new run: one sentence if the path cannot hold it
    ck = check_resume_dir(path)                    # --resume: the checkpoint path, or one sentence
    with RunDirLock(path):                         # creates the directory; one sentence if it is in use
        if restartable:
            clear_unstarted_run(path)              # only ctrl_rl's own files of the unstarted run
        remove_stale_tmp(path, all_pids=True)      # and path/checkpoints: leftovers of a kill -9
        ...                                        # write config.json, train, checkpoint

What a run directory holds (everything else is "not a ctrl_rl run"): ``config.json``, ``metrics.jsonl``,
``learning_curve.png``, TensorBoard's ``events.out.tfevents.*``, ``checkpoints/`` (``*.pt``), the lock
``.lock``, temporary files ``.<name>.tmp<PID>`` of interrupted atomic writes, and ``pretrain/``, the nested
run directory (same files) of an offline-to-online run's offline phase.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
import uuid
from pathlib import Path

from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import _TMP_RE, _pid_alive

LOCK_NAME = ".lock"
_BREAK_NAME = ".lock.break"  # mutex held while a stale lock is removed
HALF_WRITTEN_STALE = 10.0  # seconds after which an empty or unreadable lock counts as left by a killed process
_OWN_FILES = {"config.json", "metrics.jsonl", "learning_curve.png", LOCK_NAME, _BREAK_NAME}
_EVENTS_RE = re.compile(r"events\.out\.tfevents\..+")
_CHECKPOINT_RE = re.compile(r".+\.pt")
_SUB_RUNS = ("pretrain",)  # nested run directories: the offline pre-training phase of an offline-to-online run


def _is_own_file(name: str) -> bool:
    return name in _OWN_FILES or bool(_EVENTS_RE.fullmatch(name) or _TMP_RE.fullmatch(name))


def _foreign_entries(path: Path, prefix: str = "") -> list[str]:
    """Entries of ``path`` (with its checkpoints/ and nested pretrain/ run) that ctrl_rl does not write, sorted."""
    foreign = []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.name == "checkpoints" and entry.is_dir(follow_symlinks=False):
            for sub in sorted(os.scandir(entry.path), key=lambda e: e.name):
                if not (sub.is_file(follow_symlinks=False)
                        and (_CHECKPOINT_RE.fullmatch(sub.name) or _TMP_RE.fullmatch(sub.name))):
                    foreign.append(f"{prefix}checkpoints/{sub.name}")
        elif not prefix and entry.name in _SUB_RUNS and entry.is_dir(follow_symlinks=False):
            foreign += _foreign_entries(Path(entry.path), f"{entry.name}/")
        elif not (entry.is_file(follow_symlinks=False) and _is_own_file(entry.name)):
            foreign.append(prefix + entry.name)
    return foreign


def _checkpoints(path: Path) -> list[str]:
    """The checkpoint files of the run in ``path`` and of its nested runs (``pretrain/checkpoints/...``)."""
    found = []
    for sub, prefix in ((path, ""), *((path / n, f"{n}/") for n in _SUB_RUNS)):
        ck = sub / "checkpoints"
        if ck.is_dir():
            found += sorted(f"{prefix}checkpoints/{n}" for n in os.listdir(ck)
                            if _CHECKPOINT_RE.fullmatch(n) and not n.startswith("."))
    return found


def _writable(p: Path) -> bool:
    return os.access(p, os.W_OK | os.X_OK)


def check_new_run_dir(path: str | Path) -> bool:
    """Check, without writing anything, that ``path`` can hold a new run; one UserInputError sentence if not.

    Accepted: a missing directory whose nearest existing ancestor is a writable directory, an empty writable
    directory, or a writable directory holding only a ctrl_rl run that stopped before its first checkpoint.
    Returns True in that last case: the caller should ``clear_unstarted_run(path)`` (holding ``RunDirLock``)
    before starting. Refused: an existing file, an unwritable directory or ancestor, a directory with other
    files, a run with a checkpoint (resume it with ``--resume``), a run directory in use by another process.
    """
    p = Path(path)
    shown = str(path)
    if p.exists() and not p.is_dir():
        raise UserInputError(f"run directory {shown!r} is an existing file: expected a directory path (new or empty)")
    if not p.exists():
        anc = p.absolute().parent
        while not anc.exists():
            anc = anc.parent
        if not anc.is_dir():
            raise UserInputError(f"run directory {shown!r} cannot be created because {str(anc)!r} is a file: "
                                 "expected a path under a directory")
        if not _writable(anc):
            raise UserInputError(f"run directory {shown!r} cannot be created because {str(anc)!r} is not writable: "
                                 "expected a path under a directory you can write to")
        return False
    if not _writable(p):
        raise UserInputError(f"run directory {shown!r} is not writable: expected a directory you can write to")
    try:
        foreign = _foreign_entries(p)
    except OSError as e:
        raise UserInputError(f"run directory {shown!r} cannot be read ({e.strerror}): "
                             "expected a readable directory") from None
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise UserInputError(f"run directory {shown!r} holds files that are not part of a ctrl_rl run "
                             f"({foreign[0]!r}{more}): "
                             "expected a new or empty directory")
    if _checkpoints(p):
        raise UserInputError(f"run directory {shown!r} already holds a run with a checkpoint: "
                             "expected a new directory, "
                             f"or --resume {shown} to continue that run")
    owner = lock_owner(p)
    if owner is not None and owner.get("alive"):
        who = f"process {owner['pid']} on {owner.get('host')}" if owner.get("pid") is not None else "another process"
        raise UserInputError(f"run directory {shown!r} is in use by {who}: "
                             "expected one training process per run directory")
    return any(True for _ in os.scandir(p))


def clear_unstarted_run(path: str | Path) -> list[str]:
    """Remove ctrl_rl's own files of a run that stopped before its first checkpoint (config.json, metrics,
    TensorBoard events, plot, temporary files, an empty checkpoints/), keeping the lock; returns the names
    removed. Refuses, in one sentence, a directory with a checkpoint or with files ctrl_rl did not write."""
    p = Path(path)
    if _checkpoints(p):
        raise UserInputError(f"run directory {str(path)!r} holds a checkpoint: expected --resume {path}, not a restart")
    foreign = _foreign_entries(p)
    if foreign:
        raise UserInputError(f"run directory {str(path)!r} holds files that are not part of a ctrl_rl run "
                             f"({foreign[0]!r}): expected only the files of an unstarted run")
    removed = []
    for sub, prefix in ((p / n, f"{n}/") for n in _SUB_RUNS):
        if sub.is_dir():
            removed += [prefix + r for r in _clear_own_files(sub)]
            sub.rmdir()  # emptied: only ctrl_rl's files were there (checked above)
            removed.append(prefix.rstrip("/"))
    return removed + _clear_own_files(p)


def _clear_own_files(p: Path) -> list[str]:
    removed = []
    ck = p / "checkpoints"
    if ck.is_dir():
        for name in os.listdir(ck):  # only temporary files are left (no *.pt: checked by the caller)
            (ck / name).unlink(missing_ok=True)
            removed.append(f"checkpoints/{name}")
        ck.rmdir()
        removed.append("checkpoints")
    for name in sorted(os.listdir(p)):
        if name not in (LOCK_NAME, _BREAK_NAME) and _is_own_file(name):
            (p / name).unlink(missing_ok=True)
            removed.append(name)
    return removed


def check_resume_dir(path: str | Path) -> Path:
    """The checkpoint to resume from, ``path/checkpoints/latest.pt`` (or, for an offline-to-online run stopped
    in its pre-training phase, ``path/pretrain/checkpoints/latest.pt``), or one UserInputError sentence: a
    missing path, a file, a directory that is not a run, or a run killed before its first checkpoint (which
    is restarted without --resume). The checkpoint itself is validated by ``load_checkpoint``."""
    p = Path(path)
    shown = str(path)
    if not p.exists():
        raise UserInputError(f"resume directory {shown!r} does not exist: "
                             "expected a run directory written by `ctrl-rl train`")
    if not p.is_dir():
        raise UserInputError(f"resume directory {shown!r} is a file: "
                             "expected a run directory written by `ctrl-rl train`")
    if not (p / "config.json").is_file():
        raise UserInputError(f"resume directory {shown!r} has no config.json: "
                             "expected a run directory written by `ctrl-rl train`")
    ck = p / "checkpoints" / "latest.pt"
    pre = [p / n / "checkpoints" / "latest.pt" for n in _SUB_RUNS if (p / n / "checkpoints" / "latest.pt").is_file()]
    if not ck.is_file() and pre:
        return pre[0]  # stopped inside the offline pre-training phase of an offline-to-online run
    if not ck.is_file():
        if _checkpoints(p):
            raise UserInputError(f"resume directory {shown!r} has no checkpoints/latest.pt (only "
                                 f"{_checkpoints(p)[-1]!r}): expected the latest.pt that `ctrl-rl train` writes")
        raise UserInputError(f"resume directory {shown!r} stopped before its first checkpoint, so there is nothing to "
                             f"resume: expected a restart without --resume (the same command with --run-dir {shown})")
    return ck


# -- the lock ---------------------------------------------------------------------------------------------
def _read_lock(lock: Path) -> tuple[bytes, dict | None]:
    """The lock file's bytes and its parsed owner (None when unreadable or half-written)."""
    try:
        raw = lock.read_bytes()
    except FileNotFoundError:
        return b"", None
    try:
        owner = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw, None
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return raw, None
    return raw, owner


def lock_owner(path: str | Path) -> dict | None:
    """``{"pid", "host", "alive", ...}`` of the lock of run directory ``path``, or None when it is not
    locked. ``alive`` is False only when the owner ran on this host and is gone (a lock of another host
    is assumed alive: its process cannot be checked from here)."""
    raw, owner = _read_lock(Path(path) / LOCK_NAME)
    if not raw and owner is None and not (Path(path) / LOCK_NAME).exists():
        return None
    if owner is None:
        return {"pid": None, "host": None, "alive": True}
    same_host = owner.get("host") == socket.gethostname()
    return {**owner, "alive": (not same_host) or _pid_alive(owner["pid"])}


class RunDirLock:
    """Exclusive use of a run directory by one process: ``with RunDirLock(run_dir): ...``.

    Entering creates ``run_dir`` (and its parents) and ``run_dir/.lock`` atomically (``O_CREAT|O_EXCL``)
    holding ``{"pid", "host", "token", "time"}``. If another live process holds it, UserInputError names
    that process. A lock whose process is gone (same host) is taken over, with a message on stderr; a lock
    of another host is never taken over (the sentence says to remove it if that process is gone). Leaving
    the block (normally or by an exception) removes the lock if it is still this one's.
    Under torchrun only rank 0 should take the lock.
    """

    def __init__(self, path: str | Path, wait: float = 2.0):
        self.path = Path(path)
        self.lock = self.path / LOCK_NAME
        self.wait = wait  # seconds to wait for a lock being written or broken by another process
        self.token = uuid.uuid4().hex
        self.held = False

    def _content(self) -> bytes:
        return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "token": self.token,
                           "time": time.time()}).encode()

    def _refuse(self, owner: dict) -> UserInputError:
        shown = str(self.path)
        if owner.get("pid") is None:
            return UserInputError(f"run directory {shown!r} is being locked by another process (its .lock is not yet "
                                  f"written): expected one training process per run directory")
        if owner.get("host") not in (None, socket.gethostname()):
            return UserInputError(f"run directory {shown!r} is in use by process {owner['pid']} on host "
                                  f"{owner['host']!r} "
                                  f"(its .lock): expected one training process per run directory; delete "
                                  f"{str(self.lock)!r} if that process is gone")
        return UserInputError(f"run directory {shown!r} is in use by process {owner.get('pid')} (its .lock): "
                              "expected one "
                              "training process per run directory; wait for it to finish or stop it")

    def acquire(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserInputError(f"run directory {str(self.path)!r} cannot be created ({e.strerror}): expected a path "
                                 "under a directory you can write to") from None
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pass
            except OSError as e:
                raise UserInputError(f"run directory {str(self.path)!r} cannot be locked ({e.strerror}): expected a "
                                     "directory you can write to") from None
            else:
                try:
                    os.write(fd, self._content())
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self.held = True
                return
            raw, owner = _read_lock(self.lock)
            if owner is None:
                if not raw and not self.lock.exists():
                    continue  # released meanwhile
                # being written right now, or left half-written by a process killed at that moment
                if time.time() - _mtime(self.lock) < HALF_WRITTEN_STALE:
                    if time.monotonic() < deadline:
                        time.sleep(0.05)
                        continue
                    raise self._refuse({"pid": None})
                owner = {"pid": None, "host": socket.gethostname()}
                stale = True
            else:
                stale = owner.get("host") == socket.gethostname() and not _pid_alive(owner["pid"])
            if not stale:
                raise self._refuse(owner)
            if self._break(raw):
                whose = (f"belonged to process {owner['pid']}, which is no longer running"
                         if owner.get("pid") is not None
                         else f"was left half-written more than {HALF_WRITTEN_STALE:.0f} s ago")
                print(f"ctrl-rl: taking over run directory {str(self.path)!r}: its lock {whose}", file=sys.stderr)
            elif time.monotonic() > deadline:
                raise self._refuse(owner)
            else:
                time.sleep(0.05)

    def _break(self, seen: bytes) -> bool:
        """Remove the stale lock whose bytes were ``seen``, under a mutex so that of several processes
        breaking it at once, only one removes it (and never a fresh lock written meanwhile)."""
        mutex = self.path / _BREAK_NAME
        try:
            fd = os.open(mutex, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            _, m = _read_lock(mutex)
            if (m is not None and m.get("host") == socket.gethostname() and not _pid_alive(m["pid"])) or \
                    (m is None and time.time() - _mtime(mutex) > HALF_WRITTEN_STALE):
                mutex.unlink(missing_ok=True)  # its breaker died holding it
            return False
        try:
            os.write(fd, self._content())
            try:
                if self.lock.read_bytes() != seen:
                    return False  # replaced meanwhile: judge the new one
                self.lock.unlink()
            except FileNotFoundError:
                return False
            return True
        finally:
            os.close(fd)
            mutex.unlink(missing_ok=True)

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        raw, owner = _read_lock(self.lock)
        if owner is not None and owner.get("token") == self.token:
            self.lock.unlink(missing_ok=True)

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except FileNotFoundError:
        return time.time()
