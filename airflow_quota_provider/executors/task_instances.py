"""What QuotaExecutor reads and writes of Airflow's task instances, every write guarded by state."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from sqlalchemy import select, update

from airflow.models.log import Log
from airflow.models.taskinstance import TaskInstance
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sqlalchemy.orm import Session

    from airflow_quota_provider.models.job import QuotaJob

log = logging.getLogger("airflow_quota_provider.executors.quota_executor")

# Task instance states in which a try's task process has said its last word.
TRY_ENDED = frozenset(
    {
        TaskInstanceState.SUCCESS,
        TaskInstanceState.FAILED,
        TaskInstanceState.UP_FOR_RETRY,
        TaskInstanceState.UP_FOR_RESCHEDULE,
        TaskInstanceState.DEFERRED,
        TaskInstanceState.SKIPPED,
        TaskInstanceState.REMOVED,
        TaskInstanceState.UPSTREAM_FAILED,
    }
)
# A try that Airflow will queue again (or has): the job goes back to its place.
BACK_IN_LINE = frozenset({TaskInstanceState.UP_FOR_RESCHEDULE, TaskInstanceState.QUEUED, TaskInstanceState.SCHEDULED, None})


def ti_filter(job: QuotaJob) -> tuple:
    return (
        TaskInstance.dag_id == job.dag_id,
        TaskInstance.run_id == job.run_id,
        TaskInstance.task_id == job.task_id,
        TaskInstance.map_index == job.map_index,
    )


def ti_key(job: QuotaJob) -> TaskInstanceKey:
    return TaskInstanceKey(job.dag_id, job.task_id, job.run_id, job.try_number, job.map_index)


def ti_state(job: QuotaJob, session: Session) -> str | None:
    return session.scalar(select(TaskInstance.state).where(*ti_filter(job)))


def set_ti_state(job: QuotaJob, target: TaskInstanceState, *, from_states: Iterable[str], session: Session) -> bool:
    """Move the job's task instance to ``target`` if it is in one of ``from_states``; True if it was."""
    result = session.execute(
        update(TaskInstance)
        .where(*ti_filter(job), TaskInstance.state.in_(list(from_states)))
        .values(state=target)
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)


def mark_failed(where: list, key: TaskInstanceKey, label: object, message: str, session: Session) -> None:
    """Set the task instance matched by ``where`` to failed and leave ``message`` in Airflow's log
    table (``quota failed``) and in the scheduler's log."""
    session.execute(
        update(TaskInstance)
        .where(*where)
        .values(state=TaskInstanceState.FAILED, end_date=datetime.now(timezone.utc))
        .execution_options(synchronize_session=False)
    )
    session.add(Log(event="quota failed", task_instance=key, extra=message))
    log.error("Task %s failed: %s", label, message)


def fail_ti(job: QuotaJob, message: str, session: Session, *, from_states=None) -> None:
    """Fail the job's task instance (guarded by its state) with ``message``."""
    states = from_states or [
        TaskInstanceState.RUNNING,
        TaskInstanceState.UP_FOR_RESCHEDULE,
        TaskInstanceState.QUEUED,
        TaskInstanceState.SCHEDULED,
    ]
    where = [*ti_filter(job), TaskInstance.state.in_(states)]
    mark_failed(where, ti_key(job), job.ti_label(), message, session)
