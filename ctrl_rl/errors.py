"""Errors that speak to the user.

A ``UserInputError`` carries one sentence naming the input that was wrong and what was expected
(for example an unknown env id). The CLI prints the message without a traceback and exits with code 2.
"""

from __future__ import annotations


class UserInputError(ValueError):
    """A wrong env id, config key, file or argument given by the user; the message is one clear sentence."""
