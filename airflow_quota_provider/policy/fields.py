"""Reading plain data (parsed YAML or JSON) field by field, with errors that name the field.

Both input formats of the policy (the quota file and the decision file) are read through
:class:`Fields`, so every bad value is reported the same way: its path, what was wrong and, for a
closed set, the allowed values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_quota_provider.policy.errors import PolicyError, path_key, shorten

_MISSING = object()
INT_LIMIT = 2**63
"""Integers are within 64 bits (a capacity or a priority of more is a mistake, and the executor's
tables could not hold it)."""


def _describe(value: Any) -> str:
    """The value as a message may quote it: a short ``repr``, never the whole of a large value."""
    if isinstance(value, str):
        return shorten(value)
    if type(value).__name__ == "OversizeInt":  # from policy.documents: an integer of thousands of digits
        return repr(value)
    return f"{shorten(value)} ({type(value).__name__})"


def printable(name: str, path: str) -> str:
    """``name`` when every character of it is printable. Every string of either document is a name
    (a host, a job id, a team) that reaches logs, pending reasons and the UI: a newline or an escape
    sequence there forges lines, a bidi mark reorders them."""
    if not name.isprintable():
        at = next(index for index, char in enumerate(name) if not char.isprintable())
        raise PolicyError(path, f"{_describe(name)} has a control or invisible character at index {at}; names must be printable")
    return name


class Fields:
    """One mapping being read; complains about unknown keys when :meth:`done` is called."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise PolicyError(path or "(the document)", f"expected a mapping, got {_describe(data)}")
        self._data = data
        self._path = path
        self._seen: set[str] = set()

    def child(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def _get(self, key: str, default: Any) -> Any:
        self._seen.add(key)
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise PolicyError(self.child(key), "is required")
            return default
        return value

    def has(self, key: str) -> bool:
        return key in self._data

    def str(self, key: str, default: Any = _MISSING, *, choices: Iterable[str] | None = None) -> Any:
        value = self._get(key, default)
        if value is None and default is None:
            return None
        if choices is not None:
            allowed = tuple(choices)
            if value not in allowed:
                raise PolicyError(self.child(key), f"{_describe(value)} is not one of {', '.join(allowed)}")
        if not isinstance(value, str) or not value:
            raise PolicyError(self.child(key), f"expected a non-empty string, got {_describe(value)}")
        return printable(value, self.child(key))

    def int(self, key: str, default: Any = _MISSING, *, minimum: int | None = 0, nullable: bool = False) -> Any:
        value = self._get(key, default)
        if value is None and (nullable or default is None):
            return None
        # bool is an int subclass; "true" GPUs is a mistake worth naming.
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise PolicyError(self.child(key), f"expected an integer, got {_describe(value)}")
        if not -INT_LIMIT <= value < INT_LIMIT:
            raise PolicyError(self.child(key), f"{_describe(value)} is beyond the 64-bit integer range")
        if minimum is not None and value < minimum:
            raise PolicyError(self.child(key), f"{value} is below the minimum {minimum}")
        return value

    def number(self, key: str, default: Any = _MISSING, *, minimum: float | None = 0.0, maximum: float | None = None,
               nullable: bool = False) -> Any:
        value = self._get(key, default)
        if value is None and (nullable or default is None):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise PolicyError(self.child(key), f"expected a finite number, got {_describe(value)}")
        if minimum is not None and value < minimum:
            raise PolicyError(self.child(key), f"{value} is below the minimum {minimum}")
        if maximum is not None and value > maximum:
            raise PolicyError(self.child(key), f"{value} is above the maximum {maximum:g}")
        return float(value)

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise PolicyError(self.child(key), f"expected true or false, got {_describe(value)}")
        return value

    def list(self, key: str, default: Any = _MISSING) -> list[tuple[Any, str]]:
        """Items of a list field, each with its path (``key[3]``)."""
        value = self._get(key, default)
        if value is None:
            return []
        if not isinstance(value, list):
            raise PolicyError(self.child(key), f"expected a list, got {_describe(value)}")
        return [(item, f"{self.child(key)}[{index}]") for index, item in enumerate(value)]

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        return self._get(key, default)

    def done(self) -> None:
        unknown = sorted((key for key in self._data if key not in self._seen), key=str)
        if unknown:
            raise PolicyError(
                self.child(path_key(unknown[0])),
                f"unknown field; allowed fields are {', '.join(sorted(self._seen))}",
            )
