"""QuotaExecutor: Airflow tasks on shared GPU quotas, borrowed, lent and preempted by priority.

A task's quota is its pool, its GPUs its ``pool_slots``, its priority its ``priority_weight``;
``executor_config["quota"]`` (:class:`~airflow_quota_provider.protocol.QuotaTaskConfig`) may name
others and carry ``preemptible``, ``max_preemptions``, ``grace_period_s`` and
``expected_runtime_s`` (else estimated from the task's history, :mod:`.runtimes`), and ``nodes``: a
task on several hosts (a gang, :mod:`.gangs`) runs its command on each, started and stopped together.
A task whose ``executor_config["quota"]`` holds a value the executor cannot use (``{"gpus": "four"}``)
fails, naming the field and what is allowed: the scheduler goes on.

Every heartbeat, :meth:`QuotaExecutor.sync` rebuilds the state from the provider's tables, asks the
policy core what to do for each job queue, and acts: it launches admitted jobs on their devices,
tells victims to stop, and writes every waiting job's reason and position. The tables are the only
truth, so a restarted scheduler carries on where the old one stopped.

Where processes run is the launcher's business (:mod:`.launcher`): ``[quota] launcher = local``
forks them on this machine (the default), ``celery`` sends them to GPU hosts running
``airflow quota worker`` (:mod:`.celery_launcher`). Each heartbeat is a :class:`~.cycle.Cycle` passed to
three parts: the reconciler (:mod:`.reconcile`), the scheduler (:mod:`.schedule`) and the actor
(:mod:`.act`); job state changes live in :mod:`airflow_quota_provider.models.transitions`.

Preemption (no Airflow retry is consumed, the task keeps its try_number):

1. the victim's preempt file (``QUOTA_PREEMPT_FILE``, on its host) is written with ``reason``,
   ``preemptor`` and ``deadline``; a task that knows the protocol stops its command and raises
   ``AirflowRescheduleException``;
2. a task still running at the deadline is set to ``up_for_reschedule`` (guarded by
   ``state = 'running'``), after which its supervisor terminates it (DESIGN §5);
3. once its process is gone, its devices are freed, the preemption is counted and the job waits
   for Airflow to queue it again, then goes back to its original place (``submitted_at`` is kept).
   No executor event is emitted for it: an event would read as "killed externally" and cost a retry.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select

from airflow.configuration import conf
from airflow.executors import workloads
from airflow.executors.base_executor import BaseExecutor
from airflow.executors.executor_loader import ExecutorLoader
from airflow.models.pool import Pool
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session
from airflow_quota_provider.executors.act import Actor, reject
from airflow_quota_provider.executors.config import (
    LAUNCHERS, MANAGED_POOL, QuotaConfig, discover_devices, local_gpu_type, state_dir,
)
from airflow_quota_provider.executors.cycle import Cycle
from airflow_quota_provider.executors.estimates import StartEstimates
from airflow_quota_provider.executors.gangs import Gangs
from airflow_quota_provider.executors.reconcile import Reconciler
from airflow_quota_provider.executors.runtimes import CheckpointTimes, RuntimeHistory, local_checkpoint_dir
from airflow_quota_provider.executors.schedule import Scheduler
from airflow_quota_provider.metrics import GpuSecondsMeter, emit_metrics
from airflow_quota_provider.models import transitions
from airflow_quota_provider.models.coordination import POOLS, db_now, lock
from airflow_quota_provider.models.job import EventKind, JobState, QuotaJob, Report, record_config_loaded, record_event
from airflow_quota_provider.protocol import QuotaTaskConfig, QuotaTaskConfigError
from airflow_quota_provider.quota_file import QuotaConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sqlalchemy.orm import Session

    from airflow.executors.workloads import ExecutorWorkload
    from airflow.models.taskinstancekey import TaskInstanceKey
    from airflow_quota_provider.executors.launcher import Launcher
    from airflow_quota_provider.policy import QuotaFile

SCHEDULE_EVERY_S = 1.0
_ACTIVE = frozenset(state.value for state in JobState.active())


class QuotaExecutor(BaseExecutor):
    """Runs tasks on GPUs handed out by shared quotas, on this machine or a fleet (see the module
    docstring)."""

    is_local = True
    serve_logs = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.launcher: Launcher | None = None
        """Set with the parts by :meth:`start`: the reconciler, the scheduler and the actor."""
        self.reconciler: Reconciler | None = None
        self.scheduler: Scheduler | None = None
        self.actor: Actor | None = None
        self._last_schedule = 0.0
        self._dirty = True
        """Whether something changed since the scheduler last decided (then it decides this heartbeat)."""
        self._runtimes = RuntimeHistory()
        """Recent successful durations per task, for the expected runtime of newly queued jobs."""
        self._gpu_seconds = GpuSecondsMeter()
        self._failed_cycles = 0
        self._load_startup_config()
        self._estimates = StartEstimates(conf.getfloat("quota", "estimate_interval_s", fallback=30.0), self.log)
        """Estimated start times, forecast in a background thread from the states decided on."""

    @property
    def quota_file(self) -> QuotaFile:
        return self.config.quota_file

    def _load_startup_config(self) -> None:
        """Read the launcher setting, the devices and the quota file; a bad one stops the scheduler
        before it starts.

        Only the scheduler instantiates executors, so this refuses exactly the scheduler, with the
        error (naming the field) as its exit message and exit code 1, before anything is started.
        """
        try:
            self.launcher_kind = conf.get("quota", "launcher", fallback="local").strip() or "local"
            if self.launcher_kind not in LAUNCHERS:
                raise QuotaConfigError(f"[quota] launcher: {self.launcher_kind!r} is not one of {', '.join(LAUNCHERS)}")
            devices, self._device_source = (None, "GPU hosts") if self.launcher_kind == "celery" else discover_devices(
                conf.get("quota", "devices", fallback=""), conf.getint("quota", "virtual_gpus", fallback=8)
            )
            gpu_type = None if devices is None else local_gpu_type(devices, self._device_source)
            self.config = QuotaConfig(conf.get("quota", "quota_file", fallback=""), devices, gpu_type=gpu_type)
        except (QuotaConfigError, ValueError) as e:
            self.log.error("QuotaExecutor cannot start: %s", e)
            raise SystemExit(f"Error: QuotaExecutor cannot start: {e}") from None

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Set up the launcher and the quota pools (the config was checked in ``__init__``)."""
        if self.launcher_kind == "celery":
            from airflow_quota_provider.executors.celery_launcher import CeleryLauncher

            self.launcher = CeleryLauncher()
        else:
            from airflow_quota_provider.executors.local_launcher import LocalLauncher

            self.launcher = LocalLauncher(Path(state_dir()), self.config.devices, gpu_type=self.config.gpu_type)
        self._start_parts(self.launcher)
        devices = self.config.devices
        self.log.info(
            "QuotaExecutor: %s launcher, %s from %s, quota file %s",
            self.launcher_kind,
            f"{len(devices)} devices" if devices is not None else "devices",
            self._device_source,
            self.config.path,
        )
        if devices is not None and self.parallelism < 4 * max(1, len(devices)):
            self.log.warning(
                "[core] parallelism is %d: tasks waiting for quota are QUEUED and count against it, so "
                "at most that many tasks can wait or run at once; raise it (e.g. to 1024) so that "
                "high-priority tasks can reach the queue",
                self.parallelism,
            )
        with create_session() as session:
            record_config_loaded(self.quota_file, self.config.path, session=session)  # usage charges from here
            self._sync_pools(session)
            self._warn_of_a_second_scheduler_on_sqlite(session)

    def _start_parts(self, launcher: Launcher) -> None:
        """The reconciler, the scheduler and the actor, each given only what it needs."""
        checkpoints = CheckpointTimes(local_checkpoint_dir)  # when running jobs last saved: settling and victim order
        name = getattr(self, "name", None)  # set by Airflow's loader after __init__
        ours = {type(self).__name__, *(n for n in (getattr(name, "alias", None), getattr(name, "module_path", None)) if n)}
        default = name is not None and ExecutorLoader.get_default_executor_name().module_path == name.module_path
        gangs = Gangs(launcher)
        self.reconciler = Reconciler(
            launcher, gangs, self.config, checkpoints, self.log, executor_names=ours, default_executor=default
        )
        self.scheduler = Scheduler(launcher, checkpoints)
        self.actor = Actor(
            launcher, gangs, self.config, self.log,
            token=lambda ti_id: workloads.ExecuteTask.generate_token(ti_id, self.jwt_generator),
        )

    def _warn_of_a_second_scheduler_on_sqlite(self, session: Session) -> None:
        """SQLite has no advisory locks, so two schedulers there could hand the same GPUs out twice."""
        if session.get_bind().dialect.name != "sqlite":
            return
        from airflow.jobs.job import Job

        alive = datetime.now(timezone.utc) - timedelta(seconds=conf.getfloat("scheduler", "scheduler_health_check_threshold"))
        others = session.scalars(
            select(Job.id).where(
                Job.job_type == "SchedulerJob", Job.state == "running", Job.latest_heartbeat > alive, Job.id != self.job_id
            )
        ).all()
        if others:
            self.log.error(
                "Another scheduler (job %s) runs on this SQLite database: QuotaExecutor supports one scheduler "
                "on SQLite (it cannot lock job queues there); use PostgreSQL to run two (docs/fleet.md)",
                ", ".join(map(str, others)),
            )

    def end(self) -> None:
        """Stop scheduling (nothing new starts); running tasks keep running and the next scheduler
        adopts them. Tasks that already ended are reported now."""
        self._estimates.close()
        if self.launcher is None:
            return
        try:
            with create_session() as session:
                cycle = self._begin_cycle(session)
                self.reconciler.watch_launches(cycle)
                self._tell_airflow(self.reconciler.reports(cycle))
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
        job = self._job_for_key(ti.key, session, lock=True)  # the other scheduler may be admitting it
        self.running.discard(ti.key)
        self._dirty = True
        if job is None or job.state not in _ACTIVE:
            return  # ended while its task instance was queued: its report tells Airflow how
        if job.handle and self.launcher:
            self.launcher.kill(job.handle, session=session)
            self.launcher.forget(job.handle, session=session)
        transitions.revoke(job, session=session)
        session.flush()

    def try_adopt_task_instances(self, tis: Sequence[TaskInstance]) -> Sequence[TaskInstance]:
        """Adopt every task instance that has a live job row, or an end not yet reported; the tables
        hold all the state, and Airflow makes this scheduler the task instances' ``queued_by_job_id``."""
        from sqlalchemy.orm import object_session

        not_adopted: list[TaskInstance] = []
        session = object_session(tis[0]) if tis else None
        if session is None:  # never close the scheduler's (scoped) session: it owns these TIs
            return tis
        for ti in tis:
            job = self._job_for_key(ti.key, session)
            ok = job is not None and (
                job.state in {s.value for s in JobState.holding()}
                or (job.state == JobState.PENDING.value and job.workload)
                or job.report is not None  # ended while its scheduler was gone: reported by this one
            )
            if not ok:
                not_adopted.append(ti)
                continue
            if ti.queued_by_job_id != self.job_id:  # Airflow also hands back a scheduler's own after a stall
                record_event(
                    EventKind.ADOPTED, job=job, session=session,
                    message=f"by scheduler job {self.job_id} from scheduler job {ti.queued_by_job_id}; ti state {ti.state}",
                )
            self.running.add(ti.key)
        return not_adopted

    # ------------------------------------------------------------------------------------- sync

    def sync(self) -> None:
        """One cycle over the tables: reconcile, then decide and act when something changed, and at
        least every :data:`SCHEDULE_EVERY_S` for the rules that depend on time (``min_runtime_s``,
        ``preemption_delay_s``) and priority edits. A failure is logged and retried next heartbeat."""
        if self.launcher is None:
            return
        try:
            with create_session() as session:
                cycle = self._begin_cycle(session)
                self._dirty |= self.reconciler.reconcile(cycle)
                self._tell_airflow(self.reconciler.reports(cycle))
                session.flush()
                if self._schedule_due(cycle):
                    self.actor.act(cycle, self.scheduler.plan(cycle))
                    session.flush()
                    self._publish(cycle)
                self._estimates.write(cycle.now, session=session)
                self.reconciler.keep_queued_alive(cycle)
                if self.running:
                    self.running.difference_update(self.reconciler.handed_over(cycle))
        except Exception:
            self._failed_cycles += 1
            if self._failed_cycles == 1:  # once per outage (a database restart fails every heartbeat)
                self.log.exception("QuotaExecutor cycle failed; it is retried on every heartbeat until it works")
            return
        if self._failed_cycles:
            self.log.warning("QuotaExecutor cycles work again after %d failed", self._failed_cycles)
            self._failed_cycles = 0

    def _begin_cycle(self, session: Session) -> Cycle:
        """Read the quota file if edited, then begin the cycle (the locks go with its commit)."""
        self._dirty |= self._reload_quota_file(session)
        return Cycle.begin(session, self.quota_file, self.job_id)

    def _schedule_due(self, cycle: Cycle) -> bool:
        """Whether to decide this heartbeat. A change seen while the other scheduler held a queue (a
        task it has not read) stays to decide when this one holds it: the other may have decided
        before it committed."""
        now = time.monotonic()
        if not cycle.locked or not (self._dirty or now - self._last_schedule >= SCHEDULE_EVERY_S):
            return False
        self._dirty = self._dirty and cycle.missed
        self._last_schedule = now
        return True

    def _publish(self, cycle: Cycle) -> None:
        """Hand the states just decided on to the start-time forecast and the metrics."""
        states = self.scheduler.states
        self._estimates.submit(states, cycle.now)
        # A queue decided by the other scheduler this heartbeat is read from the table.
        decided_all = all(q.name in cycle.locked for q in cycle.quota_file.queues)
        emit_metrics(cycle.quota_file, session=cycle.session, states=states if decided_all else None)
        self._gpu_seconds.emit(cycle.quota_file, session=cycle.session, now=cycle.now)

    def _tell_airflow(self, reports: Iterable[tuple[TaskInstanceKey, Report]]) -> None:
        """Send the reconciler's reports as executor events; a released task is only no longer counted."""
        for key, report in reports:
            if report == Report.RELEASED:
                self.running.discard(key)
                continue
            self.running.add(key)  # change_state removes it (it may have been queued by another)
            if report == Report.FAILED:
                self.fail(key, info="QuotaExecutor: the task process was killed")
            else:
                self.success(key)

    # ----------------------------------------------------------------------------------- helpers

    def _job_for_key(self, key: TaskInstanceKey, session: Session, *, lock: bool = False) -> QuotaJob | None:
        query = select(QuotaJob).where(
            QuotaJob.dag_id == key.dag_id,
            QuotaJob.run_id == key.run_id,
            QuotaJob.task_id == key.task_id,
            QuotaJob.map_index == key.map_index,
            QuotaJob.try_number == key.try_number,
        )
        if lock:
            query = query.with_for_update().execution_options(populate_existing=True)
        return session.scalars(query).first()

    def _submit(self, workload: workloads.ExecuteTask, session: Session) -> QuotaJob:
        """Create the job for a newly queued task, or give a known job (preempted, revoked) its new
        workload while it keeps its place. A task whose ``executor_config["quota"]`` holds a value it
        cannot use is recorded with its pool and pool slots as if it had none, then rejected as the
        policy's rejections are: its task fails with the reason, the scheduler goes on."""
        ti = workload.ti
        try:
            asked, refusal = QuotaTaskConfig.from_executor_config(ti.executor_config), None
        except QuotaTaskConfigError as e:
            asked, refusal = QuotaTaskConfig(), str(e)
        nodes = asked.nodes or 1
        pool = session.scalar(select(TaskInstance.pool).where(TaskInstance.id == ti.id)) or ""
        quota = asked.quota or (pool if pool != Pool.DEFAULT_POOL_NAME else "") or conf.get("quota", "default_quota", fallback="")
        # Locked until the scheduler commits: the other scheduler may be settling this job (a
        # preempted task queued again) and must not decide on what it read before.
        job = self._job_for_key(ti.key, session, lock=True) or QuotaJob(
            dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, map_index=ti.map_index, try_number=ti.try_number
        )
        now = db_now(session)
        transitions.submit(
            job,
            workload=workload.model_dump_json(),
            ti_id=str(ti.id),
            quota=str(quota),
            gpus=_total_gpus(ti.pool_slots, asked.gpus, nodes),
            nodes=nodes,
            gpu_types=asked.gpu_type,
            priority=ti.priority_weight if asked.priority is None else asked.priority,
            preemptible=asked.preemptible,
            max_preemptions=asked.max_preemptions,
            grace_period_s=asked.grace_period_s,
            expected_runtime_s=self._runtimes.expected(ti.dag_id, ti.task_id, asked.expected_runtime_s, session=session),
            now=now,
            session=session,
        )
        # In the scheduler's transaction, so the task instance it has just queued fails as it commits;
        # a stopping job (its task queued again early) is not waiting and keeps its state.
        if refusal is not None and job.state == JobState.PENDING.value:
            reject(job, refusal, Cycle(session, now, self.quota_file, locked=frozenset(), scheduler_job=self.job_id))
        return job

    def _reload_quota_file(self, session: Session) -> bool:
        """Pick up an edited quota file; a bad edit keeps the last good configuration and says why."""
        try:
            if not self.config.reload():
                return False
        except QuotaConfigError as e:
            self.log.error("Quota file edit rejected, keeping the last good configuration: %s", e)
            record_event(EventKind.CONFIG_REJECTED, session=session, message=str(e))
            return True
        self.log.info("Quota file reloaded: %s", self.config.path)
        record_config_loaded(self.quota_file, self.config.path, session=session)
        self._sync_pools(session)
        return True

    def _sync_pools(self, session: Session) -> None:
        """One Airflow pool per quota with unlimited slots: the executor, not the pool, gates tasks.
        Under a lock: a second scheduler starting at the same moment would insert the same pools and
        die on the unique name (seen in CI: the compose file starts two schedulers at once)."""
        lock(POOLS, session=session)
        for queue in self.quota_file.queues:
            for quota in queue.quotas:
                Pool.create_or_update_pool(
                    quota.name,
                    slots=-1,
                    description=f"Shared quota {quota.name} of job queue {queue.name}: "
                    f"{quota.capacity} GPUs, {quota.sharing} {MANAGED_POOL}",
                    include_deferred=False,
                    session=session,
                )

    def debug_dump(self) -> None:
        super().debug_dump()
        with create_session() as session:
            for job in session.scalars(select(QuotaJob).where(QuotaJob.state != JobState.FINISHED.value)):
                self.log.info("quota job %s", json.dumps(job.to_dict(), default=str))


def _total_gpus(pool_slots: int, gpus: int | None, nodes: int) -> int:
    """All the GPUs a task asks for: ``gpus`` (per host) times its hosts when ``executor_config``
    names them, else its pool slots (the operators write ``gpus`` x ``nodes`` there)."""
    return pool_slots if gpus is None else gpus * nodes
