"""Hostile quota files and decision files: each is one error naming where it went wrong, quickly,
in little memory, from both readers (``load_quota_file`` and the decision-file CLI)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from airflow_quota_provider.policy import PolicyError, load_quota_file
from airflow_quota_provider.policy.__main__ import main
from airflow_quota_provider.policy.documents import QUOTA_FILE_LIMITS, load_json, load_yaml

EXAMPLE = Path(__file__).parents[2] / "examples" / "quotas.yaml"
# CPU seconds with tracemalloc on (which slows Python 2-3x; 3.0 s was seen once on a loaded 2-core
# machine for what takes 0.3 s alone): far below the unbounded reader's 52 s and 3 GB.
TIME_BOUND_S = 10.0
MEMORY_BOUND = 64 << 20


def billion_laughs() -> str:
    """489 bytes that stand for 10^9 strings."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\nqueues: *i\n"


QUOTA_ENTRY = "  quotas: [{name: team-a, capacity: 1}]\n"

HOSTILE_QUOTA_FILES = [
    pytest.param(billion_laughs().encode(), r"more than 200000 values", id="billion laughs are refused by count"),
    pytest.param(b"queues: &a [*a]\n", r"nested deeper than 32 levels", id="an alias inside itself"),
    pytest.param(b"queues: " + b"[" * 5000 + b"]" * 5000, r"nested deeper than 32 levels", id="flow nesting"),
    pytest.param(b"queues:\n- name: q\n  capacity: " + b"9" * 5000 + b"\n" + QUOTA_ENTRY.encode(),
                 r"queues\[0\]\.capacity: expected an integer, got <an integer of 5000 digits>", id="thousands of digits"),
    pytest.param(b"queues:\n- name: q\n  capacity: 1.0e+300\n" + QUOTA_ENTRY.encode(),
                 r"queues\[0\]\.capacity: .* beyond the 64-bit integer range", id="a float standing for a huge integer"),
    pytest.param("queues:\n- name: café\n".encode("latin-1"), r"not UTF-8 text \(byte 19, line 2\)", id="latin-1"),
    pytest.param(b"queues:\n- name: q\n  capacity: 4\n  capacity: 8\n" + QUOTA_ENTRY.encode(),
                 r"queues\[0\]\.capacity: given twice", id="a duplicate key"),
    pytest.param(b'queues:\n- name: q\n  capacity: 4\n  quotas: [{name: "team-x\\n", capacity: 1}]\n',
                 r"queues\[0\]\.quotas\[0\]\.name: 'team-x\\n' is not a valid name", id="a name ending in a newline"),
    pytest.param(b"queues:\n- name: q\n  capacity: 4\n  quotas: [{name: " + b"x" * 100_000 + b", capacity: 1}]\n",
                 r"'x{70,80}\.\.\. \(100000 characters\) is not a valid name", id="a long bad value is cut short"),
    pytest.param(b"queues: []\n" + b"#" * (QUOTA_FILE_LIMITS.max_bytes + 1), r"larger than the limit of 1048576 bytes",
                 id="too large"),
    pytest.param(b"queues: [\n", r"not valid YAML", id="truncated"),
    pytest.param(b"queues:\n- name: q\n  capacity: !!binary aGVsbG8=\n" + QUOTA_ENTRY.encode(),
                 r"queues\[0\]\.capacity: expected an integer, got b'hello'", id="a binary scalar"),
]


def _bounded(call):
    """Run ``call``; return what it raised, failing when it took longer or more memory than the bounds."""
    tracemalloc.start()
    start = time.process_time()
    try:
        call()
    except PolicyError as error:
        raised = error
    else:
        raised = None
    finally:
        elapsed = time.process_time() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < TIME_BOUND_S, f"took {elapsed:.1f} s"
    assert peak < MEMORY_BOUND, f"peak {peak >> 20} MiB"
    return raised


@pytest.mark.parametrize(("content", "message"), HOSTILE_QUOTA_FILES)
def test_a_hostile_quota_file_is_one_bounded_error(tmp_path, content, message):
    path = tmp_path / "quotas.yaml"
    path.write_bytes(content)
    error = _bounded(lambda: load_quota_file(path))
    assert error is not None
    assert len(str(error)) < 1000
    assert error.path
    assert re.search(message, str(error)), str(error)


def test_the_quota_file_cli_exits_2_on_billion_laughs(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(billion_laughs())
    result = subprocess.run(
        [sys.executable, "-m", "airflow_quota_provider.policy", "validate", str(path)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr


def test_merge_keys_still_work_and_the_mapping_own_keys_override_them(tmp_path):
    path = tmp_path / "quotas.yaml"
    path.write_text(
        "defaults: &defaults {capacity: 2, sharing: reserve}\n"
        "queues:\n- name: q\n  capacity: 4\n  quotas:\n"
        "  - {<<: *defaults, name: a}\n"
        "  - {<<: *defaults, name: b, sharing: lend}\n"
    )
    data = load_yaml(path)
    del data["defaults"]
    path.write_text(json.dumps(data))  # JSON is YAML
    quotas = load_quota_file(path).queues[0].quotas
    assert [(q.name, q.capacity, q.sharing) for q in quotas] == [("a", 2, "reserve"), ("b", 2, "lend")]


DESIGN_DECISION = {
    "now": 1000.0, "capacity": 8,
    "quotas": [{"name": "team-a", "capacity": 8}],
    "running": [], "pending": [{"id": "j2", "quota": "team-a", "gpus": 4, "priority": 50, "submitted_at": 990.0}],
}

HOSTILE_DECISION_FILES = [
    pytest.param(b'{"now": 1, "capacity": ' + b"9" * 5000 + b', "quotas": []}',
                 r"^capacity: expected an integer, got <an integer of 5000 digits>", id="thousands of digits"),
    pytest.param(b'{"now": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", r"nested deeper than 32 levels",
                 id="deeper than Python recurses"),
    pytest.param(b'{"now": ' + b"[" * 40 + b"]" * 40 + b"}", r"nested deeper than 32 levels", id="deeper than the bound"),
    pytest.param(b'{"now": 1, "now": 2}', r"^now: given twice", id="a duplicate key"),
    pytest.param(b'{"now": "\xe9"}', r"not UTF-8 text \(byte 9, line 1\)", id="latin-1"),
    pytest.param(b'{"now": NaN}', r"^now: expected a finite number, got nan", id="NaN"),
    pytest.param(b'{"now": 1e400}', r"^now: expected a finite number, got inf", id="1e400"),
    pytest.param(json.dumps(dict(DESIGN_DECISION, pending=[dict(DESIGN_DECISION["pending"][0], priority=2**64)])).encode(),
                 r"^pending\[0\]\.priority: 18446744073709551616 \(int\) is beyond the 64-bit integer range", id="beyond 64 bits"),
    pytest.param(json.dumps(dict(DESIGN_DECISION, pending=[dict(DESIGN_DECISION["pending"][0], id="x" * 10**5)] * 2)).encode(),
                 r"^pending\[1\]\.id: duplicate job id 'x+\.\.\.", id="a long repeated value is cut short"),
]


@pytest.mark.parametrize(("content", "message"), HOSTILE_DECISION_FILES)
def test_a_hostile_decision_file_exits_2_naming_the_field(tmp_path, capsys, content, message):
    path = tmp_path / "state.json"
    path.write_bytes(content)
    codes = []
    assert _bounded(lambda: codes.append(main(["decide", str(path)]))) is None
    assert codes == [2]
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err) < 1000, err
    assert re.search(message, err.removeprefix("error: ")), err


def test_load_json_reads_a_plain_document(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(DESIGN_DECISION))
    assert load_json(path) == DESIGN_DECISION
