"""QuotaExecutor: Airflow tasks on shared GPU quotas, borrowed, lent and preempted by priority.

A task's quota is its pool (or ``executor_config["quota"]["quota"]``), its GPUs its ``pool_slots``,
its priority its ``priority_weight``; ``executor_config["quota"]`` may also carry ``gpus``,
``priority``, ``preemptible``, ``max_preemptions`` and ``grace_period_s``.

Every heartbeat, :meth:`QuotaExecutor.sync` rebuilds the state from the provider's tables, asks the
policy core what to do for each job queue, and acts: it launches admitted jobs on their devices,
tells victims to stop, and writes every waiting job's reason and position. The tables are the only
truth, so a restarted scheduler carries on where the old one stopped.

Preemption (no Airflow retry is consumed, the task keeps its try_number):

1. the victim's preempt file (``QUOTA_PREEMPT_FILE``) is written with ``reason``, ``preemptor`` and
   ``deadline``; a task that knows the protocol stops its command and raises
   ``AirflowRescheduleException``;
2. a task still running at the deadline is set to ``up_for_reschedule`` (guarded by
   ``state = 'running'``), after which its supervisor terminates it (DESIGN §5);
3. once its process is gone, its devices are freed, the preemption is counted and the job waits
   for Airflow to queue it again, then goes back to its original place (``submitted_at`` is kept).
   No executor event is emitted for it: an event would read as "killed externally" and cost a retry.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta, timezone
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import or_, select, tuple_, update

from airflow.configuration import conf
from airflow.executors import workloads
from airflow.executors.base_executor import BaseExecutor
from airflow.executors.executor_loader import ExecutorLoader
from airflow.models.log import Log
from airflow.models.pool import Pool
from airflow.models.taskinstance import TaskInstance
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.session import create_session
from airflow.utils.state import TaskInstanceState
from airflow_quota_provider.executors.local_launcher import LocalLauncher, discover_devices
from airflow_quota_provider.metrics import emit_metrics
from airflow_quota_provider.models.job import (
    EventKind,
    JobState,
    QuotaJob,
    QuotaPreemptionCount,
    allocate_devices,
    allocated_devices,
    count_preemption,
    devices_of,
    preemption_count,
    record_event,
    release_devices,
)
from airflow_quota_provider.policy import (
    Job,
    PolicyError,
    QuotaFile,
    State,
    decide,
    load_quota_file,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow.executors.workloads import ExecutorWorkload

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
# A stopping task whose supervisor has not ended it this long after its state was changed is killed.
FORCE_KILL_AFTER_S = 60.0
KEEPALIVE_EVERY_S = 5.0
SCHEDULE_EVERY_S = 1.0


class QuotaConfigError(ValueError):
    """The quota file or the launcher's devices cannot be used; the message names the field."""


def load_config(path: str, devices: Sequence[str]) -> tuple[QuotaFile, dict[str, list[str]]]:
    """Read the quota file and split the devices among its job queues, in file order."""
    if not path:
        raise QuotaConfigError("[quota] quota_file: not set; point it at the quota file (YAML)")
    try:
        quota_file = load_quota_file(path)
    except PolicyError as e:
        raise QuotaConfigError(f"{path}: {e}") from None
    except OSError as e:
        raise QuotaConfigError(f"[quota] quota_file: cannot read {path}: {e.strerror}") from None
    split: dict[str, list[str]] = {}
    start = 0
    for i, queue in enumerate(quota_file.queues):
        if start + queue.capacity > len(devices):
            raise QuotaConfigError(
                f"{path}: queues[{i}].capacity: {queue.capacity} GPUs, but only {len(devices) - start} of "
                f"the launcher's {len(devices)} devices are left for it ([quota] devices, nvidia-smi or "
                "[quota] virtual_gpus)"
            )
        split[queue.name] = list(devices[start : start + queue.capacity])
        start += queue.capacity
    return quota_file, split


def _ti_filter(job: QuotaJob):
    return (
        TaskInstance.dag_id == job.dag_id,
        TaskInstance.run_id == job.run_id,
        TaskInstance.task_id == job.task_id,
        TaskInstance.map_index == job.map_index,
    )


def _key(job: QuotaJob) -> TaskInstanceKey:
    return TaskInstanceKey(job.dag_id, job.task_id, job.run_id, job.try_number, job.map_index)


def policy_job(job: QuotaJob, preemptions: int) -> Job:
    """The policy's view of a job row (running and stopping jobs carry ``started_at``)."""
    return Job(
        id=job.job_id,
        quota=job.quota,
        gpus=job.gpus,
        priority=job.priority,
        submitted_at=job.submitted_at,
        started_at=job.started_at if job.state != JobState.PENDING.value else None,
        preemptible=job.preemptible,
        max_preemptions=job.max_preemptions,
        preemptions=preemptions,
        preempted_for=job.preempted_for if job.state == JobState.STOPPING.value else None,
    )


class QuotaExecutor(BaseExecutor):
    """Runs tasks locally on GPUs handed out by shared quotas (see the module docstring)."""

    is_local = True
    serve_logs = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.quota_file: QuotaFile | None = None
        self.queue_devices: dict[str, list[str]] = {}
        self.devices: list[str] = []
        self.launcher: LocalLauncher | None = None
        self._quota_path = ""
        self._quota_mtime: float | None = None
        self._last_keepalive = 0.0
        self._last_schedule = 0.0
        self._dirty = True
        self._device_source = ""
        self._metrics_cursor: int | None = None
        self._load_startup_config()

    def _load_startup_config(self) -> None:
        """Read the devices and the quota file; a bad one stops the scheduler before it starts.

        Only the scheduler instantiates executors, so this refuses exactly the scheduler, with the
        error (naming the field) as its exit message and exit code 1, before anything is started.
        """
        self._quota_path = conf.get("quota", "quota_file", fallback="")
        try:
            self.devices, self._device_source = discover_devices(
                conf.get("quota", "devices", fallback=""), conf.getint("quota", "virtual_gpus", fallback=8)
            )
            self.quota_file, self.queue_devices = load_config(self._quota_path, self.devices)
        except (QuotaConfigError, ValueError) as e:
            self.log.error("QuotaExecutor cannot start: %s", e)
            raise SystemExit(f"Error: QuotaExecutor cannot start: {e}") from None
        self._quota_mtime = self._mtime()

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Create the job directory and the quota pools (the config was checked in ``__init__``)."""
        source = self._device_source
        state_dir = conf.get("quota", "state_dir", fallback="") or os.path.join(
            conf.get("core", "airflow_home", fallback=os.environ.get("AIRFLOW_HOME", ".")), "quota"
        )
        self.launcher = LocalLauncher(Path(state_dir))
        self.log.info(
            "QuotaExecutor: %d devices from %s, queues %s, quota file %s",
            len(self.devices),
            source,
            {q: len(d) for q, d in self.queue_devices.items()},
            self._quota_path,
        )
        if self.parallelism < 4 * max(1, len(self.devices)):
            self.log.warning(
                "[core] parallelism is %d: tasks waiting for quota are QUEUED and count against it, so "
                "at most that many tasks can wait or run at once; raise it (e.g. to 1024) so that "
                "high-priority tasks can reach the queue",
                self.parallelism,
            )
        with create_session() as session:
            self._sync_pools(session)

    def end(self) -> None:
        """Stop scheduling (nothing new starts); running tasks keep running and the next scheduler
        adopts them. Tasks that already ended are reported now."""
        if self.launcher is None:
            return
        try:
            with create_session() as session:
                self._watch_processes(session)
        except Exception:
            self.log.exception("QuotaExecutor could not settle ended tasks at shutdown")

    def terminate(self) -> None:
        """Leave running tasks alone: they run in their own sessions and are re-adopted."""

    # ----------------------------------------------------------------------------- Airflow calls

    def queue_workload(self, workload: ExecutorWorkload, session: Session) -> None:
        """Record the task as a job in the scheduler's transaction (it commits with QUEUED)."""
        if not isinstance(workload, workloads.ExecuteTask):
            super().queue_workload(workload, session)
            return
        self._submit(workload, session)
        self.running.add(workload.ti.key)
        self._dirty = True

    def _process_workloads(self, workload_items: Sequence[ExecutorWorkload]) -> None:
        for workload in workload_items:
            self.queued_tasks.pop(workload.key, None)

    def revoke_task(self, *, ti: TaskInstance) -> None:
        """Airflow gave up waiting for a queued task (``task_queued_timeout``): keep the job's place.

        The job forgets its workload; when Airflow queues the task again it gets the new one (with a
        fresh token) and keeps its original ``submitted_at``.
        """
        from sqlalchemy.orm import object_session

        session = object_session(ti)
        if session is None:
            return
        job = self._job_for_key(ti.key, session)
        self.running.discard(ti.key)
        self._dirty = True
        if job is None:
            return
        if job.state in (JobState.RUNNING.value, JobState.STOPPING.value) and self.launcher:
            self.launcher.kill(job.pid)
            release_devices(job, session=session)
        job.state = JobState.PENDING.value
        job.workload = None
        job.pid = None
        record_event(EventKind.REVOKED, job=job, session=session, message="task_queued_timeout; place kept")
        session.flush()

    def try_adopt_task_instances(self, tis: Sequence[TaskInstance]) -> Sequence[TaskInstance]:
        """Adopt every task instance that has a live job row; the tables hold all the state."""
        from sqlalchemy.orm import object_session

        not_adopted: list[TaskInstance] = []
        session = object_session(tis[0]) if tis else None
        if session is None:  # never close the scheduler's (scoped) session: it owns these TIs
            return tis
        for ti in tis:
            job = self._job_for_key(ti.key, session)
            ok = job is not None and (
                job.state in (JobState.RUNNING.value, JobState.STOPPING.value)
                or (job.state == JobState.PENDING.value and job.workload)
            )
            if not ok:
                not_adopted.append(ti)
                continue
            record_event(EventKind.ADOPTED, job=job, session=session, message=f"ti state {ti.state}")
            self.running.add(ti.key)
        return not_adopted

    # ------------------------------------------------------------------------------------- sync

    def sync(self) -> None:
        """One reconcile cycle over the tables; a failure is logged and retried next heartbeat."""
        if self.launcher is None:
            return
        try:
            with create_session() as session:
                # Airflow's sessions do not autoflush: flush after each step so that the next
                # step's queries see its changes.
                for step in (
                    self._reload_quota_file,
                    self._fail_tasks_on_missing_pools,
                    self._watch_processes,
                    self._enforce_deadlines,
                ):
                    self._dirty |= bool(step(session))
                    session.flush()
                # Decide when something changed, and at least every SCHEDULE_EVERY_S for the rules
                # that depend on time (min_runtime_s, preemption_delay_s) and priority edits.
                now = time.monotonic()
                if self._dirty or now - self._last_schedule >= SCHEDULE_EVERY_S:
                    self._dirty = False
                    self._last_schedule = now
                    self._schedule(session)
                    session.flush()
                    self._metrics_cursor = emit_metrics(
                        self.quota_file, session=session, since_event_id=self._metrics_cursor
                    )
                self._keep_queued_alive(session)
        except Exception:
            self.log.exception("QuotaExecutor cycle failed; it is retried on the next heartbeat")

    # ----------------------------------------------------------------------------------- helpers

    def _job_for_key(self, key: TaskInstanceKey, session: Session) -> QuotaJob | None:
        return session.scalars(
            select(QuotaJob).where(
                QuotaJob.dag_id == key.dag_id,
                QuotaJob.run_id == key.run_id,
                QuotaJob.task_id == key.task_id,
                QuotaJob.map_index == key.map_index,
                QuotaJob.try_number == key.try_number,
            )
        ).first()

    def _submit(self, workload: workloads.ExecuteTask, session: Session) -> QuotaJob:
        """Create the job for a newly queued task, or give a known job (preempted, revoked) its new
        workload while it keeps its place."""
        ti = workload.ti
        extras = (ti.executor_config or {}).get("quota") or {}
        if not isinstance(extras, dict):
            extras = {}
        pool = session.scalar(select(TaskInstance.pool).where(TaskInstance.id == ti.id)) or ""
        quota = extras.get("quota") or (pool if pool != Pool.DEFAULT_POOL_NAME else "") or conf.get(
            "quota", "default_quota", fallback=""
        )
        now = time.time()
        job = self._job_for_key(ti.key, session)
        if job is None:
            job = QuotaJob(
                dag_id=ti.dag_id,
                run_id=ti.run_id,
                task_id=ti.task_id,
                map_index=ti.map_index,
                try_number=ti.try_number,
                submitted_at=now,
                priority=int(extras.get("priority", ti.priority_weight)),
            )
            session.add(job)
        elif job.state in (JobState.FINISHED.value, JobState.FAILED.value):
            job.submitted_at = now  # queued again after finishing (e.g. a sensor's reschedule)
            job.priority = int(extras.get("priority", ti.priority_weight))
        if job.state != JobState.STOPPING.value:
            job.state = JobState.PENDING.value
        job.ti_id = str(ti.id)
        job.quota = str(quota)
        job.gpus = int(extras.get("gpus", ti.pool_slots))
        job.preemptible = bool(extras.get("preemptible", True))
        job.max_preemptions = extras.get("max_preemptions")
        job.grace_period_s = extras.get("grace_period_s")
        job.workload = workload.model_dump_json()
        job.pending_reason = job.pending_reason or "waiting for the next scheduling cycle"
        session.flush()
        record_event(EventKind.SUBMITTED, job=job, session=session, message=f"priority {job.priority}")
        return job

    def _mtime(self) -> float | None:
        try:
            return os.stat(self._quota_path).st_mtime
        except OSError:
            return None

    def _reload_quota_file(self, session: Session) -> bool:
        """Pick up an edited quota file; a bad edit keeps the last good configuration and says why."""
        mtime = self._mtime()
        if mtime == self._quota_mtime:
            return False
        self._quota_mtime = mtime
        try:
            self.quota_file, self.queue_devices = load_config(self._quota_path, self.devices)
        except QuotaConfigError as e:
            self.log.error("Quota file edit rejected, keeping the last good configuration: %s", e)
            record_event(EventKind.CONFIG_REJECTED, session=session, message=str(e))
            return True
        self.log.info("Quota file reloaded: %s", self._quota_path)
        record_event(EventKind.CONFIG_LOADED, session=session, message=self._quota_path)
        self._sync_pools(session)
        return True

    def _sync_pools(self, session: Session) -> None:
        """One Airflow pool per quota with unlimited slots: the executor, not the pool, gates tasks."""
        assert self.quota_file is not None
        for queue in self.quota_file.queues:
            for quota in queue.quotas:
                Pool.create_or_update_pool(
                    quota.name,
                    slots=-1,
                    description=f"Shared quota {quota.name} of job queue {queue.name}: "
                    f"{quota.capacity} GPUs, {quota.sharing} (managed by QuotaExecutor)",
                    include_deferred=False,
                    session=session,
                )

    def _ti_state(self, job: QuotaJob, session: Session) -> str | None:
        return session.scalar(select(TaskInstance.state).where(*_ti_filter(job)))

    def _watch_processes(self, session: Session) -> bool:
        """Settle jobs whose process has ended: finished, preempted, or past the preemption limit."""
        assert self.launcher is not None
        self.launcher.reap()
        changed = False
        jobs = session.scalars(
            select(QuotaJob).where(QuotaJob.state.in_([JobState.RUNNING.value, JobState.STOPPING.value]))
        ).all()
        for job in jobs:
            if job.pid is None:
                continue
            if self.launcher.alive(job.id, job.pid):
                # Its task process may be gone while the supervisor is still finishing: once the task
                # has reported how this try ended, its GPUs are free.
                if not self.launcher.task_exited(job.pid):
                    continue
                ti_state = self._ti_state(job, session)
                # Not started yet, or ended without a word (wait for the supervisor); asked again
                # after the state, in case the task started and ended in between.
                if ti_state not in TRY_ENDED or not self.launcher.task_exited(job.pid):
                    continue
                ended = f"task process ended, task {ti_state}"
            else:
                ti_state = self._ti_state(job, session)
                rc = self.launcher.exit_info(job.id, job.pid).rc
                ended = f"exit code {rc}" if rc is not None else None
            changed = True
            self.launcher.forget(job.pid)
            release_devices(job, session=session)
            now = time.time()
            if job.state == JobState.STOPPING.value and job.preempt_fail_message:
                self._fail_ti(job, job.preempt_fail_message, session, from_states=None)
                job.state, job.finished_at, job.message = JobState.FAILED.value, now, job.preempt_fail_message
                self.running.discard(_key(job))
            elif job.state == JobState.STOPPING.value and ti_state in (
                TaskInstanceState.UP_FOR_RESCHEDULE,
                TaskInstanceState.QUEUED,
                TaskInstanceState.SCHEDULED,
                None,
            ):
                count = count_preemption(job, session=session)
                record_event(
                    EventKind.STOPPED,
                    job=job,
                    session=session,
                    victim=job.job_id,
                    preemptor=job.preempted_for,
                    reason=job.preempt_reason,
                    message=f"preemption {count}; waits at its original place",
                )
                requeued = ti_state == TaskInstanceState.QUEUED and job.workload
                job.state = JobState.PENDING.value if requeued else JobState.PREEMPTED.value
                if not requeued:
                    job.workload = None
                    self.running.discard(_key(job))
                job.started_at = job.pid = None
                job.preempted_for = job.preempt_deadline = job.forced_at = None
                job.pending_reason = f"preempted ({job.preempt_reason}); waiting to be queued again"
            else:
                job.state, job.finished_at = JobState.FINISHED.value, now
                job.message = ended or "process killed"
                record_event(EventKind.FINISHED, job=job, session=session, message=job.message)
                key = _key(job)
                self.running.add(key)  # change_state removes it
                if ended is None:
                    self.fail(key, info="QuotaExecutor: the task process was killed")
                else:
                    self.success(key)
            job.pid = None
        return changed

    def _fail_ti(self, job: QuotaJob, message: str, session: Session, *, from_states) -> None:
        """Fail the task instance (guarded by its state) and leave the message in Airflow's log table."""
        states = from_states or [
            TaskInstanceState.RUNNING,
            TaskInstanceState.UP_FOR_RESCHEDULE,
            TaskInstanceState.QUEUED,
            TaskInstanceState.SCHEDULED,
        ]
        where = [*_ti_filter(job), TaskInstance.state.in_(states)]
        self._mark_failed(where, _key(job), job.ti_label(), message, session)

    def _mark_failed(self, where: list, key: TaskInstanceKey, label: object, message: str, session: Session) -> None:
        """Set the task instance matched by ``where`` to failed and leave ``message`` in Airflow's
        log table (``quota failed``) and in the scheduler's log."""
        session.execute(
            update(TaskInstance)
            .where(*where)
            .values(state=TaskInstanceState.FAILED, end_date=datetime.now(timezone.utc))
            .execution_options(synchronize_session=False)
        )
        session.add(Log(event="quota failed", task_instance=key, extra=message))
        self.log.error("Task %s failed: %s", label, message)

    def _fail_tasks_on_missing_pools(self, session: Session) -> bool:
        """Fail our tasks whose pool is neither a quota nor an Airflow pool.

        Airflow never queues a task whose pool does not exist, so a task naming an unknown quota as
        its pool would otherwise wait for ever without a word (quota pools exist: _sync_pools).
        """
        assert self.quota_file is not None
        name = getattr(self, "name", None)
        ours = {type(self).__name__, *(n for n in (getattr(name, "alias", None), getattr(name, "module_path", None)) if n)}
        executor = TaskInstance.executor.in_(ours)
        default = ExecutorLoader.get_default_executor_name()
        if name is not None and default.module_path == name.module_path:
            executor = or_(executor, TaskInstance.executor.is_(None))
        tis = session.scalars(
            select(TaskInstance).where(
                TaskInstance.state == TaskInstanceState.SCHEDULED,
                TaskInstance.pool.not_in(select(Pool.pool)),
                executor,
            )
        ).all()
        quotas = ", ".join(q.name for queue in self.quota_file.queues for q in queue.quotas)
        for ti in tis:
            message = (
                f"pool: {ti.pool!r} is not one of the quotas {quotas} (nor an Airflow pool), "
                "so this task could never be queued"
            )
            where = [TaskInstance.id == ti.id, TaskInstance.state == TaskInstanceState.SCHEDULED]
            self._mark_failed(where, ti.key, ti.key, message, session)
        return bool(tis)

    def _enforce_deadlines(self, session: Session) -> bool:
        """Past its grace period, a stopping task is set to up_for_reschedule so that its supervisor
        ends it (or to failed, past its preemption limit); it is killed if that does not work."""
        assert self.launcher is not None
        now = time.time()
        changed = False
        stopping = session.scalars(select(QuotaJob).where(QuotaJob.state == JobState.STOPPING.value)).all()
        for job in stopping:
            if job.forced_at is not None:
                if now - job.forced_at > FORCE_KILL_AFTER_S:
                    self.log.warning("Killing %s: still running after its state was changed", job.ti_label())
                    self.launcher.kill(job.pid)
                continue
            if job.preempt_deadline is None or now < job.preempt_deadline:
                continue
            target = TaskInstanceState.FAILED if job.preempt_fail_message else TaskInstanceState.UP_FOR_RESCHEDULE
            result = session.execute(
                update(TaskInstance)
                .where(*_ti_filter(job), TaskInstance.state == TaskInstanceState.RUNNING)
                .values(state=target)
                .execution_options(synchronize_session=False)
            )
            if not result.rowcount and self._ti_state(job, session) == TaskInstanceState.QUEUED:
                self.launcher.kill(job.pid)  # the task never reported running: nothing to lose
            job.forced_at = now
            changed = True
            record_event(
                EventKind.FORCED, job=job, session=session, victim=job.job_id, preemptor=job.preempted_for,
                reason=job.preempt_reason, message=f"grace period over; task set to {target.value}",
            )
            self.log.info("Grace period over for %s: task set to %s", job.ti_label(), target.value)
        return changed

    def _keep_queued_alive(self, session: Session) -> bool:
        """Refresh queued_dttm of tasks waiting for quota (or launched and still starting) so that
        ``task_queued_timeout`` does not revoke them and, after two revokes, fail them."""
        now = time.time()
        timeout = conf.getfloat("scheduler", "task_queued_timeout")
        if now - self._last_keepalive < min(KEEPALIVE_EVERY_S, timeout / 4) or not conf.getboolean(
            "quota", "keep_queued_alive", fallback=True
        ):
            return False
        self._last_keepalive = now
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=timeout / 4)
        # Waiting jobs, and launched ones whose task has not reported running yet (a slow start).
        keys = session.execute(
            select(QuotaJob.dag_id, QuotaJob.run_id, QuotaJob.task_id, QuotaJob.map_index).where(
                QuotaJob.state.in_([JobState.PENDING.value, JobState.RUNNING.value, JobState.STOPPING.value]),
                QuotaJob.workload.is_not(None),
            )
        ).all()
        if not keys:
            return False
        result = session.execute(
            update(TaskInstance)
            .where(
                tuple_(TaskInstance.dag_id, TaskInstance.run_id, TaskInstance.task_id, TaskInstance.map_index).in_(
                    [tuple(k) for k in keys]
                ),
                TaskInstance.state == TaskInstanceState.QUEUED,
                TaskInstance.queued_dttm < cutoff,
            )
            .values(queued_dttm=datetime.now(timezone.utc))
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount)

    # ------------------------------------------------------------------------------- scheduling

    def _schedule(self, session: Session) -> bool:
        """Build the policy state per job queue, decide, and act on the decision."""
        assert self.quota_file is not None and self.launcher is not None
        now = time.time()
        jobs = session.scalars(
            select(QuotaJob)
            .where(QuotaJob.state.in_([JobState.PENDING.value, JobState.RUNNING.value, JobState.STOPPING.value]))
            .order_by(QuotaJob.submitted_at, QuotaJob.id)
        ).all()
        if not jobs:
            return False
        counts = {
            (c.dag_id, c.run_id, c.task_id, c.map_index): c.count
            for c in session.scalars(
                select(QuotaPreemptionCount).where(
                    tuple_(
                        QuotaPreemptionCount.dag_id,
                        QuotaPreemptionCount.run_id,
                        QuotaPreemptionCount.task_id,
                        QuotaPreemptionCount.map_index,
                    ).in_([(j.dag_id, j.run_id, j.task_id, j.map_index) for j in jobs])
                )
            )
        }
        by_queue: dict[str, tuple[list[Job], list[Job]]] = {}
        by_id = {j.job_id: j for j in jobs}
        changed = False
        quota_names = [q.name for queue in self.quota_file.queues for q in queue.quotas]
        for job in jobs:
            if job.state == JobState.PENDING.value and not job.workload:
                continue  # revoked or not yet queued again: keeps its place, invisible until then
            try:
                queue = self.quota_file.queue_of(job.quota)
            except (PolicyError, KeyError):
                if job.state == JobState.PENDING.value:
                    self._reject(job, self._unknown_quota_message(job, quota_names), session)
                    changed = True
                continue
            if job.queue_name != queue.name:
                job.queue_name = queue.name
            running, pending = by_queue.setdefault(queue.name, ([], []))
            pj = policy_job(job, counts.get((job.dag_id, job.run_id, job.task_id, job.map_index), 0))
            (pending if job.state == JobState.PENDING.value else running).append(pj)

        launches: list[QuotaJob] = []
        for queue in self.quota_file.queues:
            if queue.name not in by_queue:
                continue
            running, pending = by_queue[queue.name]
            state = State.for_queue(queue, running, pending)
            decision = decide(state, now)
            for rejection in decision.reject:
                self._reject(by_id[rejection.id], rejection.reason, session)
                changed = True
            for preemption in decision.preempt:
                self._preempt(by_id[preemption.id], preemption, queue, now, session)
                changed = True
            in_use = {q.name: 0 for q in queue.quotas}
            for job in running:
                in_use[job.quota] = in_use.get(job.quota, 0) + job.gpus
            for job_id in decision.admit:
                job = by_id[job_id]
                if self._admit(job, queue, in_use, now, session):
                    launches.append(job)
                    changed = True
            for p in decision.pending:
                job = by_id[p.id]
                if (job.pending_reason, job.pending_position) != (p.reason, p.position):
                    job.pending_reason, job.pending_position = p.reason, p.position
                    changed = True
        if launches:
            session.commit()  # devices are recorded before any process exists
            for job in launches:
                self._launch(job, session)
        return changed

    def _unknown_quota_message(self, job: QuotaJob, names: list[str]) -> str:
        if not job.quota:
            return (
                f"task {job.ti_label()} has no quota: set pool=<quota> (one of {', '.join(names)}) "
                'or executor_config={"quota": {"quota": <quota>}}'
            )
        return f"quota: {job.quota!r} is not one of {', '.join(names)} (quota file {self._quota_path})"

    def _reject(self, job: QuotaJob, reason: str, session: Session) -> None:
        """A job that can never run: fail its task with the reason, keep serving everyone else."""
        self._fail_ti(job, f"QuotaExecutor: {reason}", session, from_states=[TaskInstanceState.QUEUED])
        job.state, job.finished_at, job.message = JobState.FAILED.value, time.time(), reason
        job.pending_reason = job.pending_position = None
        record_event(EventKind.REJECTED, job=job, session=session, message=reason)
        self.running.discard(_key(job))

    def _preempt(self, job: QuotaJob, preemption, queue, now: float, session: Session) -> None:
        """Tell a running job to stop: write its preempt file; the deadline is its grace period."""
        assert self.launcher is not None
        quota = queue.quota(job.quota)
        grace = job.grace_period_s if job.grace_period_s is not None else quota.grace_period_s
        job.state = JobState.STOPPING.value
        job.preempted_for = preemption.for_
        job.preempt_reason = preemption.reason
        job.preempt_deadline = now + float(grace)
        job.preempt_fail_message = preemption.message if preemption.fail else None
        notice = {"reason": preemption.reason, "preemptor": preemption.for_, "deadline": job.preempt_deadline}
        if preemption.fail:
            notice.update(fail=True, message=preemption.message)
        self.launcher.write_preempt_notice(job.id, notice)
        fields = dict(victim=job.job_id, preemptor=preemption.for_, reason=preemption.reason)
        record_event(EventKind.PREEMPTED, job=job, session=session, message=preemption.message or None, **fields)
        if preemption.reason == "reclaim":
            record_event(EventKind.RECLAIMED, job=job, session=session, **fields)
        if preemption.fail:
            record_event(
                EventKind.PREEMPTION_LIMIT_REACHED, job=job, session=session, message=preemption.message, **fields
            )
        self.log.info(
            "Preempting %s for job %s (%s), grace %.0fs", job.ti_label(), preemption.for_, preemption.reason, grace
        )

    def _admit(self, job: QuotaJob, queue, in_use: dict[str, int], now: float, session: Session) -> bool:
        """Give an admitted job its devices (lowest free indexes of its queue) and mark it running."""
        ti_state = self._ti_state(job, session)
        if ti_state != TaskInstanceState.QUEUED:  # cleared or marked by a person while it waited
            job.state, job.finished_at = JobState.FINISHED.value, now
            job.message = f"dropped: its task instance is {ti_state or 'none'}, no longer queued"
            job.pending_reason = job.pending_position = None
            record_event(EventKind.FINISHED, job=job, session=session, message=job.message)
            self.running.discard(_key(job))
            return False
        held = allocated_devices(session=session)
        free = [d for d in self.queue_devices.get(queue.name, []) if d not in held]
        if len(free) < job.gpus:
            self.log.warning("Job %s admitted but only %d devices are free; retrying", job.job_id, len(free))
            return False
        devices = free[: job.gpus]
        allocate_devices(job, devices, session=session)
        job.state, job.started_at = JobState.RUNNING.value, now
        job.pending_reason = job.pending_position = None
        in_use[job.quota] = in_use.get(job.quota, 0) + job.gpus
        record_event(EventKind.ADMITTED, job=job, session=session, devices=",".join(devices))
        capacity = queue.quota(job.quota).capacity
        if in_use[job.quota] > capacity:
            record_event(
                EventKind.BORROWED,
                job=job,
                session=session,
                devices=",".join(devices),
                message=f"quota {job.quota} uses {in_use[job.quota]} of its {capacity} GPUs",
            )
        return True

    def _launch(self, job: QuotaJob, session: Session) -> None:
        """Start the admitted job's task with a fresh token and exactly its devices visible."""
        assert self.launcher is not None
        devices = devices_of(job.id, session=session)
        try:
            workload = workloads.ExecuteTask.model_validate_json(job.workload or "")
            workload.token = workloads.ExecuteTask.generate_token(str(workload.ti.id), self.jwt_generator)
            quota = self.quota_file.quota(job.quota) if self.quota_file else None
            grace = job.grace_period_s if job.grace_period_s is not None else (quota.grace_period_s if quota else 0)
            env = {
                "CUDA_VISIBLE_DEVICES": ",".join(devices),
                "QUOTA_JOB_ID": job.job_id,
                "QUOTA_PREEMPTION_COUNT": str(
                    preemption_count(job.dag_id, job.run_id, job.task_id, job.map_index, session=session)
                ),
                "QUOTA_GRACE_PERIOD_S": str(float(grace)),
                "QUOTA_PREEMPT_FILE": str(self.launcher.preempt_file(job.id)),
                "QUOTA_NAME": job.quota,
            }
            job.job_dir = str(self.launcher.job_dir(job.id))
            job.pid = self.launcher.launch(job.id, workload, env)
        except Exception as e:
            self.log.exception("Could not launch %s", job.ti_label())
            release_devices(job, session=session)
            job.state, job.started_at = JobState.PENDING.value, None
            job.pending_reason = f"launch failed: {e}"
        session.flush()

    def debug_dump(self) -> None:
        super().debug_dump()
        with create_session() as session:
            for job in session.scalars(select(QuotaJob).where(QuotaJob.state != JobState.FINISHED.value)):
                self.log.info("quota job %s", json.dumps(job.to_dict(), default=str))
