"""Usage accounting in a real Airflow (issue 15): borrow, reclaim, a within-quota preemption and a job
running across a period boundary; the test computes every quota's GPU-seconds per kind itself and
compares them with ``airflow quota usage --output json``, run as a CLI subprocess.

Queue q-usage (tests/executors/conftest.py): usage-a 1 GPU + usage-b 2 GPUs, no common pool.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest

from tests.integration_support import wait_for

CAPACITY = {"usage-a": 1, "usage-b": 2}
DAGS = ("usage_borrow", "usage_reclaim", "usage_within")
KINDS = ("used_within", "borrowed", "lent", "idle", "lost")  # spelled here, not imported: the test's own model
# The CLI rounds each figure to 1 ms (round(x, 3)): a figure is off by at most 0.5 ms, and the test's
# own float sums of products of ~1.7e9 s timestamps by at most ~1e-6 s. A sum of up to four rounded
# figures (conservation) is off by at most 2 ms.
ROUNDING_S = 0.001
SUM_ROUNDING_S = 0.002


@dataclass
class Hold:
    task: str
    quota: str
    gpus: int
    start: float
    end: float
    preempted: bool
    saved: float | None
    """When a preempted run's command last saved its work (its SIGTERM checkpoint), as it recorded."""


def _stub_runs(airflow) -> dict[str, list[list[dict]]]:
    """Each scenario task's command runs (one pid each, records in time order), in start order."""
    by_pid: dict[int, list[dict]] = {}
    for r in airflow.task_records():
        if r.get("name", "").startswith(("ub", "ua_")):
            by_pid.setdefault(r["pid"], []).append(r)
    runs: dict[str, list[list[dict]]] = {}
    for records in sorted(by_pid.values(), key=lambda rs: rs[0]["t"]):
        runs.setdefault(records[0]["name"], []).append(records)
    return runs


def _holds(airflow) -> list[Hold]:
    """Each run's GPU hold: its bounds are the audit log's admitted and released times (the GPUs are
    granted before Airflow's task runner starts the command and freed after the executor sees it
    exit, so no record of the task itself bounds them to the second); whether it ended by
    preemption, and when it last saved its work, is what its command recorded (SIGTERM and the
    checkpoint's time), and its recorded run must lie inside it."""
    open_: dict[int, dict] = {}
    spans: dict[str, list[tuple[float, float, str, int]]] = {}
    for e in airflow.sql("SELECT * FROM quota_event WHERE kind IN ('admitted', 'released') AND dag_id IN (?, ?, ?) "
                         "ORDER BY id", *DAGS):
        if e["kind"] == "admitted":
            open_[e["job_id"]] = dict(e)
        else:
            a = open_.pop(e["job_id"])
            spans.setdefault(a["task_id"], []).append((a["at"], e["at"], a["quota"], len(a["devices"].split(","))))
    assert not open_, f"holds never released: {open_}"
    runs = _stub_runs(airflow)
    holds = []
    for task, task_spans in spans.items():
        task_spans.sort()
        assert len(task_spans) == len(runs.get(task, [])), (task, task_spans, runs.get(task))
        for (start, end, quota, gpus), records in zip(task_spans, runs[task]):
            assert start <= records[0]["t"] and records[-1]["t"] <= end, (task, start, end, records)
            saved = [r["mtime"] for r in records if r["event"] == "checkpointed"]
            holds.append(Hold(task, quota, gpus, start, end, any(r["event"] == "sigterm" for r in records),
                              saved[-1] if saved else None))
    return holds


def _expected(holds: list[Hold], since: float, until: float) -> dict[str, dict[str, float]]:
    """Each quota's GPU-seconds per kind over [since, until), by the definitions (docs/usage.md),
    integrated over the stretches between consecutive hold bounds."""
    out = {q: dict.fromkeys(("capacity_s", *KINDS), 0.0) for q in CAPACITY}
    cuts = sorted({since, until, *(t for h in holds for t in (h.start, h.end) if since < t < until)})
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        held = {q: sum(h.gpus for h in holds if h.quota == q and h.start <= mid < h.end) for q in CAPACITY}
        over = {q: max(held[q] - c, 0) for q, c in CAPACITY.items()}
        for q, c in CAPACITY.items():
            within = min(held[q], c)
            # No common pool and two quotas: what one borrows, the other lends.
            lent = sum(g for other, g in over.items() if other != q)
            assert within + lent <= c, (a, b, held)
            for kind, gpus in (("capacity_s", c), ("used_within", within), ("borrowed", over[q]), ("lent", lent),
                               ("idle", c - within - lent)):
                out[q][kind] += gpus * (b - a)
    for h in holds:
        if h.preempted:  # since its last checkpoint, else its start, to its end
            lost_from = h.saved if h.saved is not None and h.saved > h.start else h.start
            out[h.quota]["lost"] += h.gpus * max(0.0, min(h.end, until) - max(lost_from, since))
    return out


def _usage(airflow, since: float, until: float) -> dict[str, dict]:
    out = airflow.airflow("quota", "usage", "--since", repr(since), "--until", repr(until), "--output", "json").stdout
    return {row["quota"]: row for row in json.loads(out) if row["quota"] in CAPACITY}


def test_usage_of_a_scripted_scenario_agrees_with_the_recorded_holds_to_the_millisecond(airflow):
    airflow.wait_dag("usage_within")
    since = round(time.time(), 3)
    # Borrow: usage-b's three one-GPU jobs run on its two GPUs and usage-a's idle one.
    run_b = airflow.trigger("usage_borrow")
    wait_for(lambda: len(_stub_runs(airflow)) == 3, "three usage-b commands running",
             on_timeout=lambda: airflow.tail("scheduler"))
    assert len(airflow.events("borrowed", dag_id="usage_borrow")) == 1
    # Reclaim: usage-a's job takes its GPU back from the borrower.
    run_low = airflow.trigger("usage_reclaim")
    wait_for(lambda: "ua_low" in _stub_runs(airflow), "usage-a's job running",
             on_timeout=lambda: airflow.tail("scheduler"))
    # Within-quota preemption: a higher priority usage-a job stops it.
    run_high = airflow.trigger("usage_within")
    for dag_id, run in (("usage_within", run_high), ("usage_reclaim", run_low), ("usage_borrow", run_b)):
        assert airflow.wait_run(dag_id, run) == "success", dag_id
    wait_for(lambda: not airflow.sql("SELECT 1 FROM quota_job WHERE quota IN ('usage-a', 'usage-b') "
                                     "AND state IN ('pending', 'running', 'stopping')"), "every usage job released")
    reasons = sorted((e["dag_id"], e["reason"]) for e in airflow.events("preempted") if e["dag_id"] in DAGS)
    assert ("usage_borrow", "reclaim") in reasons and ("usage_reclaim", "within_quota") in reasons, reasons

    holds = _holds(airflow)
    until = round(max(h.end for h in holds) + 1, 3)
    # The period boundary: the middle of the stretch where usage-b held three GPUs, so that a job
    # (each of usage-b's), its borrowing and usage-a's lending are all cut by it.
    points = sorted({t for h in holds for t in (h.start, h.end)})
    borrowing = [(a, b) for a, b in zip(points, points[1:])
                 if sum(h.gpus for h in holds if h.quota == "usage-b" and h.start <= (a + b) / 2 < h.end) == 3]
    assert borrowing, holds
    boundary = round(sum(borrowing[0]) / 2, 3)
    assert [h for h in holds if h.start < boundary < h.end and h.quota == "usage-b"]

    whole = _usage(airflow, since, until)
    first, second = _usage(airflow, since, boundary), _usage(airflow, boundary, until)
    for (start, end), rows in (((since, until), whole), ((since, boundary), first), ((boundary, until), second)):
        expected = _expected(holds, start, end)
        assert set(rows) == set(CAPACITY)
        for quota, row in rows.items():
            assert {k: row[k] for k in expected[quota]} == pytest.approx(expected[quota], abs=ROUNDING_S), (quota, start, end)
            # Conservation on the real output: capacity x time is used within, lent or idle.
            assert row["used_within"] + row["lent"] + row["idle"] == pytest.approx(row["capacity_s"], abs=SUM_ROUNDING_S)
            assert row["capacity_s"] == pytest.approx(CAPACITY[quota] * (end - start), abs=ROUNDING_S)
        # No common pool: every borrowed GPU-second was lent by a quota.
        assert sum(r["borrowed"] for r in rows.values()) == pytest.approx(sum(r["lent"] for r in rows.values()),
                                                                           abs=SUM_ROUNDING_S)
    # The two periods add up to the whole, the boundary job's seconds on both sides of the cut.
    for quota in CAPACITY:
        for kind in ("capacity_s", *KINDS):
            assert first[quota][kind] + second[quota][kind] == pytest.approx(whole[quota][kind], abs=SUM_ROUNDING_S)
    # The scenario did what it says: usage-b borrowed and usage-a lent before the cut, both lost work.
    assert first["usage-b"]["borrowed"] > 0 and first["usage-a"]["lent"] > 0
    assert whole["usage-a"]["lost"] > 0 and whole["usage-b"]["lost"] > 0
