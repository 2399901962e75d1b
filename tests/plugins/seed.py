"""Seed quota job rows with the models' own functions, in the environment of a test Airflow.

Run as ``python -m tests.plugins.seed`` with a JSON list of cases on stdin; prints ``{case: job id}``.
Each case becomes one job of DAG ``quota_cases``, run ``seeded``, task ``<case>`` (so rows are named
after their case):

``{"case": str, "quota": str, "gpus": int, "priority": int, "state": "pending"|"running"|"finished",
"devices": [str], "position": int, "reason": str, "starts_in_s": float, "waited_s": float, "preemptions": int,
"preempted_by": <case>, "preempt_reason": str, "held": [[from_s_ago, until_s_ago], ...], "nodes": int,
"hosts": [[host, [device, ...]], ...], "backoff_s": float, "start_failures": int, "gpu_types": [str],
"gpu_type": str}``

A gang has ``nodes`` > 1 (``gpus`` is its total); running, it holds ``hosts`` (one per node, node 0's
first); pending with ``backoff_s``, it waits out that much of a backoff after ``start_failures``.
``gpu_types``: the GPU types it asks for, in order; running, it was admitted on ``gpu_type``.

``held`` makes a finished job with that history in the audit log: an ``admitted`` and a ``released``
event (``gpus`` devices) per stretch, so usage over past days has something to charge.
"""

from __future__ import annotations

import json
import sys
import time

DAG_ID = "quota_cases"
RUN_ID = "seeded"


def seed(cases: list[dict]) -> dict[str, int]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return seed_into(cases, session=session)


def seed_into(cases: list[dict], *, session) -> dict[str, int]:
    """Create the cases' jobs in ``session`` (flushed, not committed); case name -> job id."""
    from airflow_quota_provider.models import transitions
    from airflow_quota_provider.models.gang import GangNode, GangState
    from airflow_quota_provider.models.job import (
        EventKind,
        JobState,
        QuotaJob,
        count_preemption,
        record_event,
    )

    now = time.time()
    jobs: dict[str, QuotaJob] = {}
    for case in cases:
        state = case.get("state", "pending")
        job = QuotaJob(
            dag_id=DAG_ID,
            run_id=RUN_ID,
            task_id=case["case"],
            map_index=-1,
            try_number=1,
            quota=case["quota"],
            gpus=case.get("gpus", 1),
            nodes=case.get("nodes", 1),
            priority=case.get("priority", 0),
            submitted_at=now - case.get("waited_s", 30.0),
            state=JobState.PENDING.value,
            workload="{}",  # as if Airflow had queued it
            gpu_types=json.dumps(case["gpu_types"]) if case.get("gpu_types") else None,
        )
        session.add(job)
        session.flush()
        record_event(EventKind.SUBMITTED, job=job, session=session, message=f"priority {job.priority}")
        for _ in range(case.get("preemptions", 0)):
            count_preemption(job, session=session)
        if "held" in case:
            devices = ",".join(str(i) for i in range(job.gpus))
            for start_ago, end_ago in case["held"]:
                record_event(EventKind.ADMITTED, job=job, session=session, at=now - start_ago, host="local", devices=devices)
                record_event(EventKind.RELEASED, job=job, session=session, at=now - end_ago, host="local", devices=devices)
            job.state, job.started_at, job.finished_at = JobState.FINISHED.value, now - start_ago, now - end_ago
        elif state == "pending":
            job.pending_reason = case.get("reason", "waiting for the next scheduling cycle")
            job.pending_position = case.get("position", 1)
            if "starts_in_s" in case:
                job.estimated_start_at = now + case["starts_in_s"]
            if "backoff_s" in case:
                GangState(start_failures=case.get("start_failures", 1), not_before=now + case["backoff_s"]).save(job)
        elif "hosts" in case:
            gang = GangState(nodes=[GangNode(host, devices) for host, devices in case["hosts"]])
            (host, devices), *_ = case["hosts"]
            transitions.admit(job, host=host, devices=devices, gang=gang, now=now - 5, gpu_type=case.get("gpu_type"),
                              session=session)
        else:
            transitions.admit(job, host="local", devices=case.get("devices", []), now=now - 5,
                              gpu_type=case.get("gpu_type"), session=session)
            if state == "finished":
                job.state, job.finished_at, job.message = JobState.FINISHED.value, now, "exit code 0"
        jobs[case["case"]] = job
    for case in cases:
        if "preempted_by" in case:
            victim, preemptor = jobs[case["case"]], jobs[case["preempted_by"]]
            fields = dict(victim=victim.job_id, preemptor=preemptor.job_id, reason=case.get("preempt_reason", "reclaim"))
            record_event(EventKind.PREEMPTED, job=victim, session=session, **fields)
    session.flush()
    return {name: job.id for name, job in jobs.items()}


def finish(job_id: int) -> None:
    """End a running job the way the executor does: free its devices, mark it finished."""
    from airflow.utils.session import create_session
    from airflow_quota_provider.models import transitions
    from airflow_quota_provider.models.job import QuotaJob

    with create_session() as session:
        transitions.finish(session.get(QuotaJob, job_id), "exit code 0", now=time.time(), session=session)


if __name__ == "__main__":
    request = json.load(sys.stdin)
    if isinstance(request, dict) and "finish" in request:
        finish(int(request["finish"]))
        print(json.dumps({}))
    else:
        print(json.dumps(seed(request)))
