"""Generated malformed quota files and decision documents (hypothesis; 1,000 examples each in CI).

Each starts from a valid document, has values replaced by hostile ones (integers of thousands of
digits, NaN, deep nesting, odd strings, wrong types), keys dropped or added, and then its text
damaged (truncated, bytes that are not UTF-8, a line repeated so that a key comes twice, YAML
aliases that expand a billion times). Run in-process through the CLI's ``main``, every one exits 0
or 2, with one ``error: <where>: <what>`` line on 2, never a traceback, within a time and a memory
bound measured here.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_quota_provider.policy.__main__ import main
from tests.policy.test_cli import DESIGN_EXAMPLE
from tests.policy.test_documents import MEMORY_BOUND, TIME_BOUND_S, billion_laughs

EXAMPLE = yaml.safe_load((Path(__file__).parents[2] / "examples" / "quotas.yaml").read_text())
HOSTS_EXAMPLE = dict(
    DESIGN_EXAMPLE,
    hosts=[{"name": "gpu-1", "gpus": 16}, {"name": "gpu-2", "gpus": 8}],
    running=[dict(DESIGN_EXAMPLE["running"][0], host="gpu-1")],
)
ERROR_LINE = re.compile(r"error: [^\n]+: [^\n]+\n\Z")

HOSTILE_VALUES = st.one_of(
    st.integers(15, 4000).map(lambda digits: 10**digits),
    st.integers(15, 4000).map(lambda digits: -(10**digits)),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 2**63, 2**63 - 1, -(2**63) - 1, 2**31]),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["team-x\n", "default_pool", "", " ", "²", "١", "team a", "x" * 300, "never\n", "lend_and_borrow "]),
    st.booleans(),
    st.none(),
    st.lists(st.integers(-3, 3) | st.text(max_size=3), max_size=4),
    st.dictionaries(st.text(max_size=8), st.integers(-3, 3) | st.none(), max_size=3),
    st.integers(20, 300).map(lambda depth: _nested(depth)),
)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(value, dict):
        for key, child in value.items():
            out.extend(_paths(child, (*path, key)))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out.extend(_paths(child, (*path, index)))
    return out


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {k: (_replace(v, rest, new) if k == head else v) for k, v in value.items()}
    return [(_replace(v, rest, new) if i == head else v) for i, v in enumerate(value)]


def _drop(value: Any, path: tuple) -> Any:
    if len(path) == 1:
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k != path[0]}
        return [v for i, v in enumerate(value) if i != path[0]]
    return _replace(value, path[:-1], _drop(_get(value, path[:-1]), path[-1:]))


def _get(value: Any, path: tuple) -> Any:
    for part in path:
        value = value[part]
    return value


@st.composite
def mutated(draw, base: dict) -> Any:
    """``base`` with one to four values replaced, dropped or given an extra key."""
    data = base
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_paths(data)))
        action = draw(st.sampled_from(("replace", "replace", "drop", "add")))
        if action == "drop" and path:
            data = _drop(data, path)
        elif action == "add" and isinstance(_get(data, path), dict):
            data = _replace(data, path, {**_get(data, path), draw(st.text(min_size=1, max_size=10)): draw(HOSTILE_VALUES)})
        else:
            data = _replace(data, path, draw(HOSTILE_VALUES))
    return data


@st.composite
def damaged(draw, text: bytes) -> bytes:
    """The document's text, perhaps damaged: truncated, bytes inserted, a line repeated, or a
    billion-laughs or deeply nested prefix (YAML only)."""
    damage = draw(st.sampled_from(("none", "none", "truncate", "bytes", "repeat_line", "laughs", "deep")))
    if damage == "truncate":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    if damage == "bytes":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.binary(min_size=1, max_size=6)) + text[at:]
    if damage == "repeat_line":
        lines = text.split(b"\n")
        at = draw(st.integers(0, len(lines) - 1))
        return b"\n".join([*lines[: at + 1], lines[at], *lines[at + 1 :]])
    if damage == "laughs":
        return billion_laughs().replace("queues: *i\n", "").encode() + text
    if damage == "deep":
        return b"x: " + b"[" * 2000 + b"]" * 2000 + b"\n" + text
    return text


def _yaml(data: Any) -> bytes:
    try:
        return yaml.safe_dump(data, allow_unicode=True, sort_keys=False).encode()
    except (yaml.YAMLError, RecursionError, ValueError):
        return json.dumps(data).encode()


def _run_bounded(tmp: Path, args: list[str], content: bytes) -> tuple[int, str]:
    path = tmp / "document"
    path.write_bytes(content)
    out, err = io.StringIO(), io.StringIO()
    tracemalloc.start()
    start = time.process_time()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([*args, str(path)])
    finally:
        elapsed = time.process_time() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < TIME_BOUND_S, f"took {elapsed:.2f} s"
    assert peak < MEMORY_BOUND, f"peak {peak >> 20} MiB"
    return code, err.getvalue()


def _check(code: int, err: str) -> None:
    assert code in (0, 2), (code, err)
    if code == 2:
        assert ERROR_LINE.fullmatch(err), err
        assert len(err) < 1000, err


# 300 generated files per suite in every profile (each a CLI run under tracemalloc): the CI
# profile's 1,000 took four minutes of CI's 30.
COMMON = settings(
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


@COMMON
@given(data=mutated(EXAMPLE).flatmap(lambda data: damaged(_yaml(data))))
def test_a_malformed_quota_file_exits_0_or_2_naming_the_field(tmp_path, data):
    _check(*_run_bounded(tmp_path, ["validate"], data))


@COMMON
@given(
    data=st.sampled_from([DESIGN_EXAMPLE, HOSTS_EXAMPLE]).flatmap(mutated).flatmap(
        lambda data: st.sampled_from([json.dumps(data).encode(), _yaml(data)]).flatmap(damaged)
    )
)
def test_a_malformed_decision_file_exits_0_or_2_naming_the_field(tmp_path, data):
    _check(*_run_bounded(tmp_path, ["decide"], data))


# A name with a newline forged a second log line, an escape sequence recoloured a terminal and a
# bidi override reversed a pending reason in the UI; quota names were refused, host names were not.
UNPRINTABLE = ["gpu-1\nerror: forged", "gpu-\x1b[31m1", "gpu-\u202e1", "gpu-\x001", "gpu-1\u2028", "gpu\t1", "\u200b"]


# Where a name goes, and the other places that must say the same name for the file to be valid.
NAME_FIELDS = {
    "hosts[0].name": [("hosts", 0, "name"), ("running", 0, "host")],
    "hosts[0].queue": [("hosts", 0, "queue")],
    "running[0].host": [("running", 0, "host")],
    "running[0].id": [("running", 0, "id")],
    "running[0].preempted_for": [("running", 0, "preempted_for")],
    "pending[0].id": [("pending", 0, "id")],
}


def _named(name: str, places: list[tuple]) -> bytes:
    data: Any = HOSTS_EXAMPLE
    for place in places:
        data = _replace(data, place[:-1], {**_get(data, place[:-1]), place[-1]: name})
    return json.dumps(data).encode()


@pytest.mark.parametrize("name", UNPRINTABLE)
@pytest.mark.parametrize("path", NAME_FIELDS)
def test_a_name_with_a_control_character_is_refused_naming_the_field(tmp_path, path, name):
    code, err = _run_bounded(tmp_path, ["decide"], _named(name, NAME_FIELDS[path]))
    _check(code, err)
    assert code == 2 and err.startswith(f"error: {path}: "), err
    # A running job's host must be one of the hosts, which are all printable.
    assert ("is not one of gpu-1, gpu-2" if path == "running[0].host" else "has a control or invisible character") in err


@pytest.mark.parametrize("name", UNPRINTABLE)
def test_a_team_name_with_a_control_character_is_refused_naming_the_field(tmp_path, name):
    data = json.loads(json.dumps(EXAMPLE))
    data["queues"][0]["quotas"][0]["teams"] = ["ml", name]
    code, err = _run_bounded(tmp_path, ["validate"], _yaml(data))
    _check(code, err)
    assert code == 2 and err.startswith("error: queues[0].quotas[0].teams[1]: "), err
    assert "has a control or invisible character" in err


@pytest.mark.parametrize("name", ["gpu-07.rack-2.example.com", "ip-10-0-0-7", "gpu 7", "ノード7", "Gpu_7"])
def test_printable_host_names_are_accepted(tmp_path, name):
    code, err = _run_bounded(tmp_path, ["decide"], _named(name, NAME_FIELDS["hosts[0].name"]))
    assert code == 0, err
