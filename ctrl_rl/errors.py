"""Errors that speak to the user.

A ``UserInputError`` carries one sentence naming the input that was wrong and what was expected
(for example an unknown env id). The CLI prints the message without a traceback and exits with code 2.
``did_you_mean`` is the one helper that suggests the closest known names in such a message.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserInputError(ValueError):
    """A wrong env id, config key, file or argument given by the user; the message is one clear sentence."""


def did_you_mean(word: str, candidates: Iterable[str], n: int = 1) -> str:
    """``" (did you mean 'x'?)"`` naming the up to ``n`` candidates closest to ``word`` (difflib's ratio >= 0.6,
    closest first, joined by "or"), or ``""`` when none is close: the hint every unknown-name message appends."""
    close = difflib.get_close_matches(str(word), sorted({str(c) for c in candidates}), n=n, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
