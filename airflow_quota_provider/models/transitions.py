"""Job state changes: one function per transition, each refusing a job in the wrong state.

The executor calls these; each writes the job row, its devices and the audit event together, and
raises :class:`InvalidTransition` naming the job and its state when the transition does not apply.
A job leaving the executor's hands gets a ``report`` (:class:`~airflow_quota_provider.models.job.Report`):
what the executor of the scheduler that queued its task must tell Airflow, whichever scheduler
settled it; task instance states stay with the executor.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from airflow_quota_provider.models.job import (
    EventKind,
    JobState,
    Report,
    UNDECIDED,
    allocate_devices,
    count_preemption,
    record_event,
    release_devices,
)
from airflow_quota_provider.models.gang import forget_nodes
from airflow_quota_provider.policy import PreemptionReason

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow_quota_provider.models.gang import GangState

    from sqlalchemy.orm import Session

    from airflow_quota_provider.models.job import QuotaJob

_HOLDING = JobState.holding()
_HOLDING_VALUES = frozenset(state.value for state in _HOLDING)


class InvalidTransition(RuntimeError):
    """A state change asked of a job in a state it does not apply to."""

    def __init__(self, job: QuotaJob, change: str, allowed: Sequence[JobState]) -> None:
        super().__init__(
            f"cannot {change} job {job.job_id} ({job.ti_label()}): it is {job.state}, "
            f"not {' or '.join(s.value for s in allowed)}"
        )


def _require(job: QuotaJob, change: str, *allowed: JobState) -> None:
    if job.state not in {s.value for s in allowed}:
        raise InvalidTransition(job, change, allowed)


def _clear_pending(job: QuotaJob) -> None:
    job.pending_reason = job.pending_position = job.estimated_start_at = None


def _forget_placement(job: QuotaJob) -> None:
    """The job no longer holds devices: its gang's nodes and the GPU type it ran on go."""
    forget_nodes(job)
    job.gpu_type = None


def _clear_stop(job: QuotaJob) -> None:
    job.preempted_for = job.preempt_deadline = job.forced_at = None


def submit(
    job: QuotaJob,
    *,
    workload: str,
    ti_id: str,
    quota: str,
    gpus: int,
    priority: int,
    preemptible: bool,
    nodes: int = 1,
    gpu_types: Sequence[str] = (),
    max_preemptions: int | None,
    grace_period_s: float | None,
    expected_runtime_s: float | None,
    now: float,
    session: Session,
) -> None:
    """new, pending, preempted, finished or failed -> pending: Airflow queued the job's task with
    ``workload``. A known job keeps its place (``submitted_at``) and its priority (a person may have
    changed it), unless it had ended: its task is queued again on the same try (a sensor's
    reschedule, a deferred task resumed). A stopping or running one stays so until its process is
    gone (its task was queued again before that was settled: :func:`finish_queued_again`), as it
    holds devices under its launch. ``gpu_types``: the GPU types it accepts, in its order of
    preference (empty: any)."""
    if job.state is None:  # not yet in the table
        session.add(job)
    if job.state in (None, JobState.FINISHED.value, JobState.FAILED.value):
        job.submitted_at, job.priority = now, priority
    if job.state not in _HOLDING_VALUES:
        job.state = JobState.PENDING.value
    job.ti_id, job.quota, job.gpus, job.nodes, job.preemptible = ti_id, quota, gpus, nodes, preemptible
    job.gpu_types = json.dumps(list(gpu_types)) if gpu_types else None
    job.max_preemptions, job.grace_period_s, job.expected_runtime_s = max_preemptions, grace_period_s, expected_runtime_s
    job.workload = workload
    job.report = None  # queued again: Airflow has moved past the try that ended
    if job.state != JobState.RUNNING.value:
        job.pending_reason = job.pending_reason or UNDECIDED
    session.flush()
    record_event(EventKind.SUBMITTED, job=job, session=session, message=f"priority {job.priority}")


def admit(
    job: QuotaJob, *, host: str, devices: Sequence[str], now: float, by: str | None = None,
    gang: GangState | None = None, gpu_type: str | None = None, session: Session,
) -> None:
    """pending -> running on ``devices`` of ``host`` (recorded before any process exists); ``by``:
    which scheduler decided it; ``gpu_type``: the GPU type the policy chose (a typed job queue's).
    A gang's nodes (``gang``, node 0's being ``host`` and ``devices``) are all allocated at once,
    one ``admitted`` event per node."""
    _require(job, "admit", JobState.PENDING)
    job.gpu_type = gpu_type  # before its admitted events, which record it: usage is accounted per type
    nodes = [(n.host, n.devices) for n in gang.nodes] if gang else [(host, devices)]
    for rank, (node_host, node_devices) in enumerate(nodes):
        allocate_devices(job, node_host, node_devices, session=session)
        node = f"node {rank} of {len(nodes)}" if gang is not None else None
        message = "; ".join(filter(None, [by, node, gpu_type and f"GPU type {gpu_type}"])) or None
        record_event(EventKind.ADMITTED, job=job, session=session, host=node_host, devices=",".join(node_devices), message=message)
    if gang is not None:
        gang.save(job)
    job.state, job.started_at, job.host, job.handle = JobState.RUNNING.value, now, host, None
    _clear_pending(job)


def launched(job: QuotaJob, handle: str) -> None:
    """A running job's process was started; ``handle`` is the launcher's name for it."""
    _require(job, "record the launch of", JobState.RUNNING)
    job.handle = handle


def launch_recovered(job: QuotaJob, handle: str) -> None:
    """A holding job takes back the launch its host got, which its scheduler stopped before noting."""
    _require(job, "recover the launch of", *_HOLDING)
    job.handle = handle


def launch_failed(job: QuotaJob, message: str, *, session: Session) -> None:
    """running -> pending: the launch failed before a process existed; the devices are freed."""
    _require(job, "undo the launch of", JobState.RUNNING)
    release_devices(job, session=session)
    _forget_placement(job)
    job.state, job.started_at, job.handle = JobState.PENDING.value, None, None
    job.pending_reason = f"launch failed: {message}"


def drop(job: QuotaJob, message: str, *, now: float, session: Session) -> None:
    """pending -> finished: its task instance is no longer queued (cleared or marked by a person)."""
    _require(job, "drop", JobState.PENDING)
    job.state, job.finished_at, job.message = JobState.FINISHED.value, now, message
    job.report = Report.RELEASED.value
    _clear_pending(job)
    record_event(EventKind.FINISHED, job=job, session=session, message=message)


def reject(job: QuotaJob, reason: str, *, now: float, session: Session) -> None:
    """pending -> failed: the job can never run under this configuration."""
    _require(job, "reject", JobState.PENDING)
    job.state, job.finished_at, job.message = JobState.FAILED.value, now, reason
    job.report = Report.RELEASED.value  # the task instance was failed with the reason
    _clear_pending(job)
    record_event(EventKind.REJECTED, job=job, session=session, message=reason)


def begin_stop(
    job: QuotaJob, *, preemptor: str, reason: PreemptionReason, deadline: float, fail_message: str | None, session: Session
) -> None:
    """running -> stopping: told to stop by ``deadline``; it holds its devices until its process is gone."""
    _require(job, "preempt", JobState.RUNNING)
    job.state = JobState.STOPPING.value
    job.preempted_for, job.preempt_reason, job.preempt_deadline = preemptor, reason, deadline
    job.preempt_fail_message = fail_message
    fields = dict(victim=job.job_id, preemptor=preemptor, reason=reason, host=job.host)
    record_event(EventKind.PREEMPTED, job=job, session=session, message=fail_message, **fields)
    if reason == PreemptionReason.RECLAIM:
        record_event(EventKind.RECLAIMED, job=job, session=session, **fields)
    if fail_message:
        record_event(EventKind.PREEMPTION_LIMIT_REACHED, job=job, session=session, message=fail_message, **fields)


def end_gang(job: QuotaJob) -> None:
    """running -> stopping: the executor ends a gang (a node's host lost, a node not started) and sends
    its task instance back to the queue. It holds its devices until none of its nodes runs, then goes
    back in line as an eviction does (:func:`evict`): no preemption counted, no retry used. Stopping,
    not running: Airflow may queue its task again before then, and a running job refuses that."""
    _require(job, "end the gang of", JobState.RUNNING)
    job.state = JobState.STOPPING.value


def force_stop(job: QuotaJob, *, target: str, now: float, session: Session) -> None:
    """A stopping job past its grace period had its task instance set to ``target``."""
    _require(job, "force the stop of", JobState.STOPPING)
    job.forced_at = now
    record_event(
        EventKind.FORCED, job=job, session=session, victim=job.job_id, preemptor=job.preempted_for,
        reason=job.preempt_reason, host=job.host, message=f"grace period over; task set to {target}",
    )


def settle_stopped(job: QuotaJob, *, requeued: bool, checkpoint_at: float | None = None, session: Session) -> int:
    """stopping -> pending (Airflow has queued it again) or preempted (not yet): its process is gone.
    ``checkpoint_at``: when the run last saved its work (for the work lost, in usage accounting).

    Counts the preemption and returns the new count; the job keeps its ``submitted_at`` (its place).
    """
    _require(job, "settle the stop of", JobState.STOPPING)
    release_devices(job, session=session)
    _forget_placement(job)
    count = count_preemption(job, session=session)
    record_event(
        EventKind.STOPPED, job=job, session=session, victim=job.job_id, preemptor=job.preempted_for,
        reason=job.preempt_reason, host=job.host, message=f"preemption {count}; waits at its original place",
        checkpoint_at=checkpoint_at,
    )
    _back_in_line(job, requeued, f"preempted ({job.preempt_reason}); waiting to be queued again")
    return count


def evict(job: QuotaJob, *, requeued: bool, why: str, session: Session) -> None:
    """running or stopping -> pending / preempted: its host was lost. Not counted as a preemption."""
    _require(job, "evict", *_HOLDING)
    release_devices(job, session=session)
    _forget_placement(job)
    record_event(EventKind.EVICTED, job=job, session=session, host=job.host, message=f"{why}; waits at its original place")
    _back_in_line(job, requeued, f"evicted ({why}); waiting to be queued again")


def _back_in_line(job: QuotaJob, requeued: bool, reason: str) -> None:
    job.state = JobState.PENDING.value if requeued else JobState.PREEMPTED.value
    if not requeued:  # the executor that gets the next workload holds the task from then on
        job.workload = None
        job.report = Report.RELEASED.value
    job.started_at = job.handle = None
    _clear_stop(job)
    job.pending_reason = reason


def finish(job: QuotaJob, message: str, *, killed: bool = False, now: float, session: Session) -> None:
    """running or stopping -> finished: its process ended on its own (the task instance says how),
    or was ``killed`` without a word (the task fails)."""
    _require(job, "finish", *_HOLDING)
    release_devices(job, session=session)
    _forget_placement(job)
    job.state, job.finished_at, job.message, job.handle = JobState.FINISHED.value, now, message, None
    job.report = (Report.FAILED if killed else Report.SUCCESS).value
    record_event(EventKind.FINISHED, job=job, session=session, host=job.host, message=message)


def finish_queued_again(job: QuotaJob, message: str, *, now: float, session: Session) -> None:
    """running -> pending: its process ended after Airflow had queued its task again on the same try
    (a sensor rescheduled, a deferred task resumed, before the run's end was settled). The run ends
    as :func:`finish` records it, nothing is told to Airflow (it has moved on), and the job waits
    with the new workload from now, as an ended job queued again does (:func:`submit`)."""
    _require(job, "finish", JobState.RUNNING)
    finish(job, message, now=now, session=session)
    job.state, job.submitted_at, job.started_at, job.report, job.pending_reason = (
        JobState.PENDING.value, now, None, None, UNDECIDED
    )


def fail_at_limit(job: QuotaJob, *, now: float, session: Session) -> None:
    """stopping -> failed: the preemption that stopped it was past its ``max_preemptions``."""
    _require(job, "fail", JobState.STOPPING)
    _failed(job, job.preempt_fail_message, now=now, session=session)


def fail_gang_start(job: QuotaJob, message: str, *, now: float, session: Session) -> None:
    """running or stopping -> failed: a gang the executor ended without all its nodes started, past
    ``[quota] gang_start_limit``."""
    _require(job, "fail", *_HOLDING)
    _failed(job, message, now=now, session=session)


def _failed(job: QuotaJob, message: str, *, now: float, session: Session) -> None:
    release_devices(job, session=session)
    _forget_placement(job)
    job.state, job.finished_at, job.message, job.handle = JobState.FAILED.value, now, message, None
    job.report = Report.RELEASED.value  # the task instance was failed with the message: nothing to tell Airflow


def revoke(job: QuotaJob, *, session: Session) -> None:
    """Any active state -> pending without a workload: Airflow revoked the queued task
    (``task_queued_timeout``); the job keeps its place and gets the next workload."""
    _require(job, "revoke", *JobState.active())
    release_devices(job, session=session)
    _forget_placement(job)
    job.state, job.workload, job.handle = JobState.PENDING.value, None, None
    record_event(EventKind.REVOKED, job=job, session=session, message="task_queued_timeout; place kept")
