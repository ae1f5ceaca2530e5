"""Atomic, self-checking checkpoints holding the full training state.

A checkpoint holds a dict readable with ``torch.load(weights_only=True)`` (tensors, numbers, strings,
lists, tuples and dicts only):
``{"format", "version", "algo", "config", "algo_state", "env_state", "obs", "rng", "counters"}``.

File layout (format version 2): one fixed-length ASCII header line, then the bytes of ``torch.save``::

    ctrl_rl.checkpoint 2 sha256:<64 hex digits> bytes:<20 decimal digits>\\n
    <torch.save zip archive>

The digest and length cover the archive, so the file alone tells whether it is complete and intact: a
truncated copy, or one with a single flipped byte anywhere (header included), is refused with one
sentence instead of loading wrong numbers. Writes go to ``.<name>.tmp<PID>`` in the same directory, are
fsynced and renamed over the target (then the directory is fsynced), so a crash never leaves a
half-written checkpoint under the real name; a kill -9 mid-write leaves only the temporary file, which
``remove_stale_tmp`` (called by every ``save_checkpoint``) deletes once its process is gone.

Format version 1 files (a bare ``torch.save`` archive, written before the checksum existed) still load,
without an integrity check: there is nothing to check them against.

``read_init`` reads the checkpoint a run starts from (``--init``): the entry's ``init_from`` says whose, and its
``init_fields`` are taken from that checkpoint's config.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import re
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import torch

from ctrl_rl.errors import UserInputError

FORMAT = "ctrl_rl.checkpoint"
VERSION = 2
_LEGACY_VERSION = 1  # bare torch.save archive, no header and no checksum
_HEADER_RE = re.compile(rb"ctrl_rl\.checkpoint (\d+) sha256:([0-9a-f]{64}) bytes:(\d{20})\n")
_HEADER_LEN = len(f"{FORMAT} {VERSION} sha256:{'0' * 64} bytes:{0:020d}\n")
_ZIP_MAGIC = b"PK\x03\x04"
_TMP_RE = re.compile(r"\..+\.tmp(\d+)")
_CHUNK = 1 << 20


def global_rng_state() -> dict:
    """Python, NumPy and torch global RNG states, in a weights_only-loadable form."""
    state = np.random.get_state()
    assert isinstance(state, tuple)  # the global RandomState is an MT19937: its legacy state is the tuple
    kind, keys, pos, has_gauss, gauss = state
    py = random.getstate()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }


def set_global_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])


def _header(digest: str, size: int) -> bytes:
    h = f"{FORMAT} {VERSION} sha256:{digest} bytes:{size:020d}\n".encode()
    assert len(h) == _HEADER_LEN
    return h


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through (torch.save needs write/flush)."""

    def __init__(self, f: BinaryIO):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, b) -> int:
        self.sha.update(b)
        self.size += len(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (a process of another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_tmp(directory: str | Path, all_pids: bool = False) -> list[Path]:
    """Delete the ``.<name>.tmp<PID>`` files that an interrupted write (kill -9, power loss) left in
    ``directory``; returns the removed paths.

    Only files whose writer process is gone are removed, and never this process's own, unless
    ``all_pids`` is set: pass it at the start of a run while holding the run directory's ``RunDirLock``,
    when no other process may be writing there. PIDs are those of this host: on a directory shared
    between hosts, rely on the lock (``all_pids=True``). A missing directory removes nothing.
    """
    removed = []
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for name in names:
        m = _TMP_RE.fullmatch(name)
        if m is None:
            continue
        pid = int(m.group(1))
        if not all_pids and (pid == os.getpid() or _pid_alive(pid)):
            continue
        p = Path(directory) / name
        try:
            if p.is_file() and not p.is_symlink():
                p.unlink()
                removed.append(p)
        except FileNotFoundError:  # removed meanwhile by another cleaner
            pass
    return removed


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not supported on this platform / filesystem: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` (plus ``format``/``version``) atomically with a sha256 header; see the module docstring."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(path.parent)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    # format/version last: re-saving a loaded (possibly version-1) dict writes the current version
    data = {**payload, "format": FORMAT, "version": VERSION}
    try:
        with open(tmp, "wb") as f:
            f.write(b"\0" * _HEADER_LEN)  # placeholder, filled in once the archive's digest is known
            w = _HashingWriter(f)
            torch.save(data, cast(BinaryIO, w))  # torch types f as IO[bytes]; it calls only write and flush
            f.seek(0)
            f.write(_header(w.sha.hexdigest(), w.size))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _not_a_checkpoint(path: Path, why: str) -> UserInputError:
    return UserInputError(f"checkpoint {str(path)!r} {why}: expected a complete .pt file written by `ctrl-rl train`")


def _read_payload(path: Path) -> Any:
    """The object stored in a checkpoint file, after checking its header, length and digest."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UserInputError(f"checkpoint {str(path)!r} cannot be read ({e.strerror or type(e).__name__}): "
                             "expected a readable .pt file written by `ctrl-rl train`") from None
    with f:
        head = f.read(_HEADER_LEN)
        if not head:
            raise _not_a_checkpoint(path, "is empty")
        if head.startswith(_ZIP_MAGIC):  # version 1: a bare torch.save archive, nothing to verify
            f.seek(0)
        else:
            m = _HEADER_RE.fullmatch(head)
            if m is None:
                if head.startswith(FORMAT.encode()[:8]) or len(head) < _HEADER_LEN:
                    raise _not_a_checkpoint(path, "has a damaged or truncated header")
                raise _not_a_checkpoint(path, "is not a ctrl_rl checkpoint (unknown file header)")
            version, digest, size = int(m.group(1)), m.group(2).decode(), int(m.group(3))
            if version != VERSION:
                raise UserInputError(f"checkpoint {str(path)!r} has format version {version}: expected {VERSION} "
                                     f"(or {_LEGACY_VERSION}), as written by this version of ctrl_rl")
            sha, n = hashlib.sha256(), 0
            while chunk := f.read(_CHUNK):
                sha.update(chunk)
                n += len(chunk)
            if n != size:
                raise _not_a_checkpoint(path, f"is truncated or was extended ({n} bytes after the header, the header "
                                              f"records {size})")
            if sha.hexdigest() != digest:
                raise _not_a_checkpoint(path, "is damaged (its sha256 checksum does not match its contents)")
            f.seek(_HEADER_LEN)  # torch reads the archive relative to this position
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch raises many types on foreign or damaged archives
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise _not_a_checkpoint(path, f"is truncated or not a ctrl_rl checkpoint ({first[:120]})") from None


def load_checkpoint(path: Path, expect_algo: str | None = None) -> dict[str, Any]:
    """Load and validate a checkpoint; every failure is one UserInputError sentence naming the file.

    Version 2 files are checked against their sha256 header before unpickling (``weights_only=True``);
    version 1 files (no header) load without that check.
    """
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"checkpoint {str(path)!r} does not exist: expected a .pt file written by `ctrl-rl train`")
    data = _read_payload(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserInputError(f"checkpoint {str(path)!r} is not a ctrl_rl checkpoint: "
                             "expected a file written by `ctrl-rl train`")
    if data.get("version") not in (VERSION, _LEGACY_VERSION):
        raise UserInputError(f"checkpoint {str(path)!r} has format version {data.get('version')!r}: expected {VERSION}")
    if not isinstance(data.get("algo"), str) or not isinstance(data.get("config"), dict):
        raise UserInputError(f"checkpoint {str(path)!r} lacks its algorithm name or config: expected a file written by "
                             "`ctrl-rl train`")
    if expect_algo is not None and data.get("algo") != expect_algo:
        raise UserInputError(f"checkpoint {str(path)!r} holds a {data.get('algo')!r} run: "
                             f"expected a {expect_algo!r} checkpoint")
    return data


def find_checkpoint(path_or_dir: str | Path) -> Path:
    """A run directory resolves to its latest checkpoint; a file is returned as is."""
    p = Path(path_or_dir)
    if p.is_dir():
        ck = p / "checkpoints" / "latest.pt"
        if not ck.is_file():
            raise UserInputError(f"run directory {str(p)!r} has no checkpoints/latest.pt: "
                                 "expected a directory written by `ctrl-rl train`")
        return ck
    if not p.exists():
        raise UserInputError(f"{str(p)!r} does not exist: expected a run directory or a checkpoint file")
    return p


def with_network_shape(cfg, saved: dict, fields: tuple[str, ...]):
    """``cfg`` with the network shape ``fields`` of a saved config dict."""
    shape = {k: tuple(saved[k]) if isinstance(saved[k], list) else saved[k] for k in fields if k in saved}
    return dataclasses.replace(cfg, **shape)


def read_init(entry, cfg, init: str) -> tuple[object, dict, str]:
    """The config with the network shape fields of ``init``'s checkpoint, that checkpoint's algo state and its
    path. Refuses checkpoints of algorithms the entry cannot start from."""
    if not entry.init_from:
        raise UserInputError(f"--init is not used by {entry.name!r}: expected no --init (it trains from scratch)")
    path = find_checkpoint(init)
    ck = load_checkpoint(path)
    if ck.get("algo") not in entry.init_from:
        raise UserInputError(f"--init {str(path)!r} holds a {ck.get('algo')!r} run: expected a checkpoint of one of "
                             f"{list(entry.init_from)} (their networks load into {entry.name})")
    return with_network_shape(cfg, ck["config"]["algo"], entry.init_fields), ck["algo_state"], str(path)
