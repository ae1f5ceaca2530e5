"""Progress output of the training loops: a tqdm bar on a terminal, plain lines in a log.

A bar redraws itself with carriage returns, which in a file or a pipe (``ctrl-rl train ... 2> log``,
a batch job, CI) becomes one ever-growing line. When the stream is not a terminal, progress is instead
one plain line every ``interval`` seconds (default 30, or ``$CTRL_RL_PROGRESS_INTERVAL``) and one at
``close()``::

    sac Pendulum: 12.0k/100k step (12%), 412 step/s, elapsed 0:00:29, left 0:03:33 | return -1187.2
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from ctrl_rl.errors import UserInputError

DEFAULT_INTERVAL = 30.0
INTERVAL_ENV = "CTRL_RL_PROGRESS_INTERVAL"


def _interval_from_env() -> float:
    raw = os.environ.get(INTERVAL_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise UserInputError(f"{INTERVAL_ENV}={raw!r}: expected a number of seconds >= 0 between progress lines")
    return value


def _si(x: float) -> str:
    """About 3 significant digits with a k/M/G suffix, as tqdm's unit_scale: 12345 -> 12.3k."""
    from tqdm import tqdm

    if float(x).is_integer() and abs(x) < 1000:
        return str(int(x))
    return tqdm.format_sizeof(x, divisor=1000)


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class PlainProgress:
    """tqdm's ``update`` / ``set_postfix_str`` / ``close`` as plain lines, at most one per ``interval``
    seconds plus one at ``close()``; no carriage returns."""

    def __init__(self, total: int, initial: int, desc: str, unit: str = "step", stream: TextIO | None = None,
                 interval: float | None = None):
        self.total, self.n, self.desc, self.unit = total, initial, desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.interval = _interval_from_env() if interval is None else interval
        self.postfix = ""
        self.initial = initial
        self.t0 = self.last = time.monotonic()
        self.n_printed: int | None = None
        self.closed = False

    def line(self) -> str:
        elapsed = time.monotonic() - self.t0
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.desc}: {_si(self.n)}/{_si(self.total)} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        parts.append(f"{_si(rate)} {self.unit}/s")
        parts.append(f"elapsed {_hms(elapsed)}")
        if rate > 0 and self.total and self.n < self.total:
            parts.append(f"left {_hms((self.total - self.n) / rate)}")
        text = ", ".join(parts)
        return f"{text} | {self.postfix}" if self.postfix else text

    def _emit(self) -> None:
        try:
            self.stream.write(self.line().replace("\r", " ").replace("\n", " ") + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # closed log or pipe: progress must never stop training
            pass
        self.last = time.monotonic()
        self.n_printed = self.n

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.last >= self.interval:
            self._emit()

    def set_postfix_str(self, s: str = "", refresh: bool = False) -> None:
        self.postfix = str(s)
        if refresh and time.monotonic() - self.last >= self.interval:
            self._emit()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.n_printed != self.n:
            self._emit()


def progress_bar(enabled: bool, total: int, initial: int, desc: str, unit: str = "step",
                 stream: TextIO | None = None, interval: float | None = None):
    """A progress display with ``update(n)``, ``set_postfix_str(s, refresh=False)`` and ``close()``, or None
    when disabled: a tqdm bar when ``stream`` (default stderr) is a terminal, else a ``PlainProgress``
    printing a line every ``interval`` seconds (default ``$CTRL_RL_PROGRESS_INTERVAL`` or 30) and at close."""
    if not enabled:
        return None
    out: TextIO = stream if stream is not None else sys.stderr
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty:
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, unit=unit, unit_scale=True, dynamic_ncols=True, desc=desc,
                    mininterval=0.5, file=out)
    return PlainProgress(total, initial, desc, unit, out, interval)
