"""The one error type of the policy core: a bad value, named by its path in the input."""

from __future__ import annotations

import re
import reprlib
from typing import Any

MAX_MESSAGE = 500
"""Characters of a :class:`PolicyError`'s message: a value quoted from a hostile file stays short."""

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlevel = 3


def shorten(value: Any, limit: int = 80, *, quote: bool = True) -> str:
    """``repr`` of ``value`` (or the text itself, ``quote=False``) cut to about ``limit`` characters,
    saying how long the whole was. Never builds the whole ``repr`` of a large or deep value."""
    if isinstance(value, str):
        shown = repr(value[: limit + 1]) if quote else value[: limit + 1]
        if len(value) <= limit:
            return shown
        return f"{shown[:limit]}... ({len(value)} characters)"
    try:
        text = _REPR.repr(value)
    except Exception:  # an int of more digits than Python prints, a repr that raises
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}..."


def path_key(key: Any) -> str:
    """A mapping key as a part of an error's path: as it is when it is a plain name, else quoted
    and cut short (an empty key, a key with a newline or a dot, a key of a megabyte)."""
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return key
    return shorten(key, 40)


def _one_line(text: str) -> str:
    """Control characters (a key named "\\n" in a hostile file) escaped, so that an error is one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class PolicyError(ValueError):
    """A value in a quota file or decision file that the policy cannot accept.

    ``path`` locates the value (``queues[0].quotas[3].sharing``), ``message`` says what is wrong and,
    where there is a closed set, which values are allowed. ``str(error)`` is ``"path: message"`` so
    that CLIs and task logs can print it as it is. Both are cut to :data:`MAX_MESSAGE` characters and
    kept on one line.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = _one_line(shorten(path, 200, quote=False))
        self.message = _one_line(shorten(message, MAX_MESSAGE, quote=False))
        super().__init__(f"{self.path}: {self.message}" if self.path else self.message)
