"""What the executor tells the policy about a job's run time: how long it is expected to take, and
when it last saved its work.

- Expected runtime (``quota_job.expected_runtime_s``, set when the task is queued): the task's
  ``executor_config["quota"]["expected_runtime_s"]`` (the operators' ``expected_runtime``), else the
  median of its recent successful durations in Airflow's ``task_instance`` table (per DAG and task
  id, so the map indexes of a mapped task are pooled), else its ``execution_timeout``, else unknown.
  Looked up per (dag_id, task_id) at most every :data:`HISTORY_REFRESH_S`: a burst of a thousand
  mapped tasks costs one query, not a thousand, in the scheduler's cycle. The timeouts of all a
  DAG's tasks come from one deserialization of it, as often: per task, a DAG of 400 tasks queued at
  once was deserialized 400 times, a fifth of the scheduler's CPU (profiled in ``benchmarks/ha.py``).
- Last checkpoint: the modification time of the newest checkpoint in the task instance's default
  checkpoint directory on a local or mounted ``[quota] checkpoint_root`` (or the local state dir),
  when written since the job started, looked at per running job at most every
  :data:`CHECKPOINT_REFRESH_S`. An object store receives a run's checkpoints only when its command
  exits, and a ``checkpoint_dir`` given to the operator is rendered on the worker: neither is seen
  here, and such jobs have no checkpoint for the policy (their lost work counts from their start).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from airflow_quota_provider.protocol import positive_number

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

HISTORY_RUNS = 20
"""Successful runs of a task the median is taken over (the most recent ones)."""
HISTORY_REFRESH_S = 300.0
CHECKPOINT_REFRESH_S = 30.0


def expected_runtime(override: Any, durations: Sequence[float], execution_timeout_s: float | None) -> float | None:
    """The expected runtime of one run, in seconds, from what is known in order of trust: the task's
    own declaration, its history, its timeout (an upper bound). A declaration that is not a positive
    number is ignored (the operators validate theirs; a hand-written ``executor_config`` may not)."""
    if (declared := positive_number(override)) is not None:
        return declared
    if durations:
        return float(statistics.median(durations))
    return execution_timeout_s


class RuntimeHistory:
    """Per (dag_id, task_id): recent successful durations and the execution timeout, cached."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._durations: dict[tuple[str, str], tuple[float, list[float]]] = {}
        self._timeouts: dict[str, tuple[float, dict[str, float | None]]] = {}

    def expected(self, dag_id: str, task_id: str, override: Any, *, session: Session) -> float | None:
        declared = expected_runtime(override, (), None)
        if declared is not None:
            return declared
        known = self._durations.get((dag_id, task_id))
        if known is None or self._clock() - known[0] >= HISTORY_REFRESH_S:
            known = self._durations[dag_id, task_id] = (self._clock(), successful_durations(dag_id, task_id, session=session))
        if known[1]:
            return expected_runtime(None, known[1], None)
        timeouts = self._timeouts.get(dag_id)
        if timeouts is None or self._clock() - timeouts[0] >= HISTORY_REFRESH_S:
            timeouts = self._timeouts[dag_id] = (self._clock(), execution_timeouts(dag_id, session=session))
        return timeouts[1].get(task_id)


def successful_durations(dag_id: str, task_id: str, *, session: Session, limit: int = HISTORY_RUNS) -> list[float]:
    """The durations of the task's most recent successful task instances (all map indexes)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.state import TaskInstanceState

    rows = session.scalars(
        select(TaskInstance.duration)
        .where(
            TaskInstance.dag_id == dag_id,
            TaskInstance.task_id == task_id,
            TaskInstance.state == TaskInstanceState.SUCCESS,
            TaskInstance.duration.is_not(None),
        )
        .order_by(TaskInstance.end_date.desc())
        .limit(limit)
    ).all()
    return [float(d) for d in rows]


def execution_timeouts(dag_id: str, *, session: Session) -> dict[str, float | None]:
    """Task id -> its ``execution_timeout`` in seconds (None where none is set), from the DAG's
    latest serialized version; empty when it cannot be read (best effort: "unknown")."""
    from airflow.models.serialized_dag import SerializedDagModel

    try:
        dag = SerializedDagModel.get_dag(dag_id, session=session)
    except Exception:  # a DAG being re-parsed or one that no longer deserializes
        log.debug("No execution_timeout for the tasks of %s", dag_id, exc_info=True)
        return {}
    if dag is None:
        return {}
    return {
        task.task_id: task.execution_timeout.total_seconds() if task.execution_timeout is not None else None
        for task in dag.tasks
    }


class CheckpointTimes:
    """When each running job last wrote a checkpoint where this scheduler can see it."""

    def __init__(self, directory_of: Callable[[str, str, str, int], Path | None], clock: Callable[[], float] = time.monotonic) -> None:
        """``directory_of(dag_id, run_id, task_id, map_index)``: a task instance's checkpoint
        directory when it is a local path, else None."""
        self._directory_of = directory_of
        self._clock = clock
        self._seen: dict[int, tuple[float, float | None]] = {}

    def last_at(
        self, job_id: int, ti: tuple[str, str, str, int], started_at: float | None, *, fresh: bool = False
    ) -> float | None:
        """The newest checkpoint's time, if written since ``started_at`` (an older one saved nothing
        of this run); ``fresh``: looked at now (a run that has just ended saved its last one)."""
        seen = self._seen.get(job_id)
        if fresh or seen is None or self._clock() - seen[0] >= CHECKPOINT_REFRESH_S:
            seen = self._seen[job_id] = (self._clock(), newest_checkpoint_time(self._directory_of(*ti)))
        at = seen[1]
        return at if at is not None and started_at is not None and at >= started_at else None

    def forget_all_but(self, job_ids: set[int]) -> None:
        for job_id in self._seen.keys() - job_ids:
            del self._seen[job_id]


def local_checkpoint_dir(dag_id: str, run_id: str, task_id: str, map_index: int) -> Path | None:
    """A task instance's default checkpoint directory, when it is on a local or mounted path."""
    from airflow_quota_provider.operators.checkpoints import default_checkpoint_dir

    try:
        directory = default_checkpoint_dir(dag_id, run_id, task_id, map_index)
    except ValueError:  # a bad [quota] checkpoint_root: the tasks report it, not the scheduler
        return None
    return directory if isinstance(directory, Path) else None


def newest_checkpoint_time(directory: Path | None) -> float | None:
    from airflow_quota_provider.operators.checkpoints import latest_checkpoint

    if directory is None:
        return None
    try:
        newest = latest_checkpoint(directory)
        return newest.stat().st_mtime if newest is not None else None
    except OSError:
        return None
