"""Reading the policy's two input documents, the quota file (YAML) and the decision file (JSON), with
bounds, so that a hostile file is one :class:`PolicyError` naming where it went wrong, never a
traceback, an hour of CPU or gigabytes of memory (a scheduler re-reads the quota file in its
heartbeat).

Both readers share the same limits (:class:`Limits`) and the same walk over what was read:

- size: the file is refused before parsing when it is larger than ``max_bytes``;
- text: it must be UTF-8 (a byte order mark is allowed);
- nesting: at most ``max_depth`` levels of mappings and lists (a YAML alias that refers to itself
  counts as infinitely deep);
- expansion: at most ``max_nodes`` values once YAML aliases and merge keys are expanded, so that a
  few hundred bytes of nested aliases ("billion laughs") cannot stand for a billion values;
- integers: at most :data:`MAX_INT_DIGITS` digits; a longer one is read as an :class:`OversizeInt`,
  which :class:`~airflow_quota_provider.policy.fields.Fields` refuses naming the field;
- keys: a mapping that gives a key twice is refused at that key's path (YAML's merge key ``<<``
  may still be overridden by a key of the mapping itself, as YAML intends).

Messages repeat at most a short prefix of what the file said (:func:`shorten`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from airflow_quota_provider.policy.errors import PolicyError, path_key, shorten

MAX_INT_DIGITS = 20
"""Digits an integer may have in either document: every 64-bit integer fits, thousands of digits do not."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int
    max_depth: int = 32
    max_nodes: int = 200_000


QUOTA_FILE_LIMITS = Limits(max_bytes=1 << 20)
"""A quota file: 1 MiB is thousands of quotas; 200,000 values after alias expansion."""
DECISION_FILE_LIMITS = Limits(max_bytes=64 << 20, max_nodes=4_000_000)
"""A decision file: tens of thousands of jobs (the JSON has no aliases, so values stay below bytes)."""


class OversizeInt:
    """An integer of more than :data:`MAX_INT_DIGITS` digits, kept as its digit count only."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


class _Mapping(dict):
    """A mapping as read, remembering the first key it was given twice (checked by :func:`_walk`)."""

    duplicate: Any = None


# -- reading bytes -------------------------------------------------------------------------------


def read_bytes(source: str | Path | BinaryIO, limits: Limits, *, what: str) -> tuple[bytes, str]:
    """At most ``limits.max_bytes`` of ``source`` (a path, or a binary stream such as stdin's: ``-``),
    and the name to report errors under."""
    name = str(source) if isinstance(source, (str, Path)) else "-"
    try:
        if isinstance(source, (str, Path)):
            with open(source, "rb") as f:
                data = _read_at_most(f, limits.max_bytes + 1)
        else:
            data = _read_at_most(source, limits.max_bytes + 1)
    except OSError as error:
        raise PolicyError(name, f"cannot read the {what}: {error.strerror or error}") from None
    if len(data) > limits.max_bytes:
        raise PolicyError(name, f"the {what} is larger than the limit of {limits.max_bytes} bytes")
    return data, name


def _read_at_most(stream: BinaryIO, size: int) -> bytes:
    """``stream.read(size)`` without allocating ``size`` bytes up front for a small file."""
    chunks, left = [], size
    while left > 0:
        chunk = stream.read(min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _text(data: bytes, name: str, what: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise PolicyError(name, f"the {what} is not UTF-8 text (byte {error.start}, line {line})") from None


# -- YAML ------------------------------------------------------------------------------------------

_INT_SIGN_AND_SEPARATORS = re.compile(r"[-+_:]|0[box]")


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader (pure Python: its parser keeps no C recursion), with a nesting bound
    while composing, a bound on merge-key expansion, long integers kept as :class:`OversizeInt`
    and duplicate keys remembered."""

    limits: Limits = QUOTA_FILE_LIMITS

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._duplicates: dict[int, yaml.Node] = {}

    def fetch_flow_collection_start(self, TokenClass) -> None:  # noqa: ANN001, N803
        # The scanner looks ahead over every open flow collection ("[", "{") for a possible simple
        # key, at a cost that grows with the square of their nesting: stop at the bound here.
        super().fetch_flow_collection_start(TokenClass)
        if self.flow_level > self.limits.max_depth:
            mark = self.get_mark()
            raise _TooDeep(f"nested deeper than {self.limits.max_depth} levels (line {mark.line + 1})")

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        self._depth += 1
        try:
            if self._depth > self.limits.max_depth:
                mark = self.peek_event().start_mark
                raise _TooDeep(f"nested deeper than {self.limits.max_depth} levels (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def flatten_mapping(self, node):  # noqa: ANN001
        # Merge keys copy the merged mappings' entries into this one. PyYAML >= 6.0.2 copies each
        # key once, older ones copy merges of merges again and again: bound it level by level.
        super().flatten_mapping(node)
        if len(node.value) > self.limits.max_nodes:
            raise _TooLarge(f"merge keys (<<) expand to more than {self.limits.max_nodes} entries (line {node.start_mark.line + 1})")

    def construct_yaml_int(self, node):  # noqa: ANN001
        value = self.construct_scalar(node)
        digits = len(_INT_SIGN_AND_SEPARATORS.sub("", value))
        if digits > MAX_INT_DIGITS:
            return OversizeInt(digits)
        return super().construct_yaml_int(node)

    def compose_mapping_node(self, anchor):  # noqa: ANN001
        # Repeated keys are found here, before merge keys (<<) are flattened into the mapping: a
        # mapping's own key may override a merged one, as YAML intends, but not another own key.
        node = super().compose_mapping_node(anchor)
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    self._duplicates.setdefault(id(node), key_node)
                seen.add(key)
        return node

    def construct_yaml_map(self, node):  # noqa: ANN001
        data = _Mapping()
        yield data
        data.update(self.construct_mapping(node))
        if id(node) in self._duplicates:
            data.duplicate = self.construct_object(self._duplicates[id(node)])


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)
_BoundedLoader.add_constructor("tag:yaml.org,2002:map", _BoundedLoader.construct_yaml_map)


class _TooDeep(Exception):
    pass


class _TooLarge(Exception):
    pass


def load_yaml(source: str | Path | BinaryIO, limits: Limits = QUOTA_FILE_LIMITS, *, what: str = "quota file") -> Any:
    """Parse a YAML document within ``limits``; every failure is a :class:`PolicyError`."""
    data, name = read_bytes(source, limits, what=what)
    text = _text(data, name, what)
    loader_class = type("_Loader", (_BoundedLoader,), {"limits": limits})
    loader = None
    try:
        loader = loader_class(text)  # the reader refuses control characters here
        value = loader.get_single_data()
    except (_TooDeep, _TooLarge) as error:
        raise PolicyError(name, str(error)) from None
    except yaml.YAMLError as error:
        raise PolicyError(name, f"not valid YAML: {_yaml_problem(error)}") from None
    except (RecursionError, ValueError, OverflowError) as error:  # a construct PyYAML itself cannot build
        raise PolicyError(name, f"not valid YAML: {shorten(str(error), 300, quote=False)}") from None
    finally:
        if loader is not None:
            loader.dispose()
    _walk(value, limits)
    return value


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's error on one line, with where it is, without the quoted snippet of the file."""
    if isinstance(error, yaml.MarkedYAMLError):
        what = "; ".join(part for part in (error.context, error.problem) if part) or "cannot parse"
        mark = error.problem_mark or error.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return shorten(what, 200, quote=False) + where
    if isinstance(error, yaml.reader.ReaderError):
        return f"character #x{error.character:04x} is not allowed (position {error.position})"
    return shorten(" ".join(str(error).split()), 200, quote=False)


# -- JSON ------------------------------------------------------------------------------------------


def _json_int(text: str) -> int | OversizeInt:
    digits = len(text.lstrip("-"))
    return OversizeInt(digits) if digits > MAX_INT_DIGITS else int(text)


def _json_float(text: str) -> float:
    return float(text)  # "1e400" is inf, refused by Fields as not finite, naming the field


def _json_object(pairs: list[tuple[str, Any]]) -> _Mapping:
    data = _Mapping()
    for key, value in pairs:
        if key in data and data.duplicate is None:
            data.duplicate = key
        data[key] = value
    return data


def load_json(source: str | Path | BinaryIO, limits: Limits = DECISION_FILE_LIMITS, *, what: str = "decision file") -> Any:
    """Parse a JSON document within ``limits``; every failure is a :class:`PolicyError`."""
    data, name = read_bytes(source, limits, what=what)
    text = _text(data, name, what)
    try:
        value = json.loads(text, parse_int=_json_int, parse_float=_json_float, object_pairs_hook=_json_object)
    except json.JSONDecodeError as error:
        raise PolicyError(name, f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})") from None
    except RecursionError:
        raise PolicyError(name, f"nested deeper than {limits.max_depth} levels") from None
    _walk(value, limits)
    return value


# -- the common walk -------------------------------------------------------------------------------


def _walk(value: Any, limits: Limits) -> None:
    """Refuse nesting beyond ``max_depth``, more than ``max_nodes`` values counted with every alias
    expanded, and duplicate keys, naming the path. Iterative, and stops at the first bound hit."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    nodes = 0
    while stack:
        item, path, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise PolicyError(path or "(document)", f"more than {limits.max_nodes} values (YAML aliases count once per use)")
        if isinstance(item, dict):
            children = [(child, f"{path}.{_key(key)}" if path else _key(key)) for key, child in item.items()]
            duplicate = getattr(item, "duplicate", None)
            if duplicate is not None:
                where = f"{path}.{_key(duplicate)}" if path else _key(duplicate)
                raise PolicyError(where, "given twice; each key may appear once")
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = [(child, f"{path}[{index}]") for index, child in enumerate(item)]
        else:
            continue
        if depth >= limits.max_depth and children:
            raise PolicyError(path or "(document)", f"nested deeper than {limits.max_depth} levels")
        stack.extend((child, child_path, depth + 1) for child, child_path in reversed(children))


def _key(key: Any) -> str:
    return path_key(key)
