"""The reconciler: brings the job table in line with what processes, hosts and Airflow did since the
last heartbeat. Each step returns whether it changed something (then the cycle decides anew)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from sqlalchemy import and_, or_, select, update

from airflow.configuration import conf
from airflow.models.pool import Pool
from airflow.models.taskinstance import TaskInstance
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.utils.state import TaskInstanceState
from airflow_quota_provider.executors.act import task_env
from airflow_quota_provider.executors.launcher import Liveness
from airflow_quota_provider.executors.task_instances import (
    BACK_IN_LINE,
    TRY_ENDED,
    fail_ti,
    mark_failed,
    set_ti_state,
    ti_filter,
    ti_key,
    ti_state,
)
from airflow_quota_provider.models import transitions
from airflow_quota_provider.models.coordination import HOSTS, try_lock
from airflow_quota_provider.models.gang import GangState
from airflow_quota_provider.models.host import mark_lost_hosts
from airflow_quota_provider.models.job import JobState, QuotaJob, Report, queued_again

if TYPE_CHECKING:
    import logging
    from collections.abc import Collection

    from sqlalchemy.orm import Session

    from airflow_quota_provider.executors.config import QuotaConfig
    from airflow_quota_provider.executors.cycle import Cycle
    from airflow_quota_provider.executors.gangs import Gangs
    from airflow_quota_provider.executors.launcher import Launcher
    from airflow_quota_provider.executors.runtimes import CheckpointTimes

# A stopping task whose supervisor has not ended it this long after its state was changed is killed.
FORCE_KILL_AFTER_S = 60.0
KEEPALIVE_EVERY_S = 5.0
HOST_CHECK_EVERY_S = 2.0
HANDOVER_CHECK_EVERY_S = 10.0
REPORT_AGAIN_S = 10.0
_IN_TRY = frozenset({TaskInstanceState.QUEUED, TaskInstanceState.RUNNING})
_HOLDING = tuple(s.value for s in JobState.holding())


class Reconciler:
    """Settles what happened to the jobs since the last cycle: ended processes, lost hosts, passed
    deadlines, launches never noted; and says what Airflow must hear of it (:meth:`reports`)."""

    def __init__(
        self,
        launcher: Launcher,
        gangs: Gangs,
        config: QuotaConfig,
        checkpoints: CheckpointTimes,
        log: logging.Logger,
        *,
        executor_names: Collection[str],
        default_executor: bool,
    ) -> None:
        """``executor_names``: what a task instance's ``executor`` says when it is ours; with
        ``default_executor``, a task instance that names none is ours too."""
        self.launcher = launcher
        self.gangs = gangs
        self.config = config
        self.checkpoints = checkpoints
        self.log = log
        self.executor_names = executor_names
        self.default_executor = default_executor
        self._last_host_check = 0.0
        self._fleet_problem = ""
        self._last_keepalive = 0.0
        self._last_handover_check = 0.0
        self._reported: dict[int, float] = {}
        """Job id -> when its report was last sent (:meth:`reports` sends until Airflow acts)."""

    def reconcile(self, cycle: Cycle) -> bool:
        """Every step, in order; whether any changed something."""
        changed = False
        # Airflow's sessions do not autoflush: flush after each step so that the next step's
        # queries see its changes.
        for step in (
            self.fail_tasks_on_missing_pools,
            self.check_hosts,
            self.recover_unrecorded_launches,
            self.watch_launches,
            self.watch_gangs,
            self.enforce_deadlines,
        ):
            changed |= step(cycle)
            cycle.session.flush()
        return changed

    def _holding_handles(self, cycle: Cycle) -> dict[str, int]:
        """Handle -> job id of every job holding devices under a launch, in the job queues this
        executor decides for this cycle."""
        rows = cycle.session.execute(
            select(QuotaJob.handle, QuotaJob.id).where(
                QuotaJob.state.in_(_HOLDING),
                QuotaJob.handle.is_not(None),
                QuotaJob.queue_name.in_(cycle.locked),
            )
        )
        return {handle: job_id for handle, job_id in rows}

    def check_hosts(self, cycle: Cycle) -> bool:
        """Mark hosts that stopped heartbeating as lost (their jobs are evicted by :meth:`watch_launches`)."""
        now, session = cycle.now, cycle.session
        if not self.launcher.places_on_hosts or now - self._last_host_check < HOST_CHECK_EVERY_S:
            return False
        if not try_lock([HOSTS], session=session):
            return False  # the other scheduler checks them this heartbeat
        self._last_host_check = now
        lost = mark_lost_hosts(conf.getfloat("quota", "host_lost_after_s", fallback=30.0), now=now, session=session)
        for host in lost:
            self.log.warning("GPU host %s lost: no heartbeat since %.0f s; its jobs are requeued", host.name, now - host.heartbeat_at)
        self._check_fleet_size(cycle)
        return bool(lost)

    def _check_fleet_size(self, cycle: Cycle) -> None:
        """Say (once per change) where the live hosts' GPUs disagree with the quota file: the hosts are
        what can run, the file's capacities are what the quotas share out."""
        gpus: dict[str, int] = {}
        for host in self.launcher.hosts(cycle.quota_file, session=cycle.session):
            if host.up:
                gpus[host.queue] = gpus.get(host.queue, 0) + len(host.devices)
        queues = cycle.quota_file.queues
        known = {queue.name for queue in queues}
        problems = [
            f"job queue {queue.name}: capacity {queue.capacity} GPUs in {self.config.path}, live hosts have {gpus.get(queue.name, 0)}"
            for queue in queues
            if gpus.get(queue.name, 0) != queue.capacity
        ] + [f"hosts serve job queue {name!r}, which is not in {self.config.path}" for name in sorted(set(gpus) - known)]
        message = "; ".join(problems)
        if message != self._fleet_problem:
            self._fleet_problem = message
            if message:
                self.log.warning("GPU fleet and quota file disagree: %s", message)
            else:
                self.log.info("GPU fleet matches the quota file")

    def recover_unrecorded_launches(self, cycle: Cycle) -> bool:
        """Jobs holding GPUs with no launch on their row: their scheduler stopped, or lost the
        database, between committing the admission and noting the launch. Past ``[quota]
        launch_start_timeout_s`` such a job takes back the launch its host got, or goes back to its
        place (a stopping one is settled: nothing of it runs). Without this it held its GPUs for ever."""
        session = cycle.session
        cutoff = cycle.now - conf.getfloat("quota", "launch_start_timeout_s", fallback=60.0)
        jobs = session.scalars(
            select(QuotaJob)
            .where(
                QuotaJob.state.in_(_HOLDING),
                QuotaJob.handle.is_(None),
                QuotaJob.queue_name.in_(cycle.locked),
                QuotaJob.started_at < cutoff,
            )
            .with_for_update()
        ).all()
        for job in jobs:
            handle = self.launcher.recorded_launch(job.id, since=job.started_at, session=session)
            if handle is not None:
                transitions.launch_recovered(job, handle)
            elif job.state == JobState.RUNNING.value:
                transitions.launch_failed(job, "its scheduler stopped while launching it; launched again", session=session)
            else:
                self._settle(job, ti_state(job, session), None, cycle)
            self.log.warning("%s had no launch on record after its admission: %s", job.ti_label(),
                             f"took back launch {handle}" if handle else "undone")
        return bool(jobs)

    def watch_launches(self, cycle: Cycle) -> bool:
        """Settle jobs whose process has ended or whose host is lost: finished, preempted, evicted, or
        past the preemption limit."""
        session = cycle.session
        handles = self._holding_handles(cycle)
        if not handles:
            return False
        changed = False
        for handle, status in self.launcher.status(handles, session=session).items():
            if status.liveness == Liveness.RUNNING:
                continue
            job = _lock_row(session, handles[handle])
            if job.handle != handle or job.state not in _HOLDING:
                continue  # settled meanwhile (by the scheduler that queued it again, or a revoke)
            gang = GangState.of(job) if job.nodes > 1 else None
            if gang is not None and status.liveness != Liveness.NEVER_STARTED and self.gangs.members_left(job, gang, session):
                continue  # node 0 is gone or going: its devices are freed once none of its nodes runs
            state = ti_state(job, session)
            if status.liveness == Liveness.TASK_EXITED:
                # A preempted task already queued again by Airflow (within a second of its
                # reschedule) has ended its try too: free its GPUs now, not when its supervisor
                # exits a heartbeat later. Otherwise it ended without a word: wait for the
                # supervisor. Asked again after the state, in case a new task started meanwhile.
                ended_try = state in TRY_ENDED or (job.state == JobState.STOPPING.value and state in BACK_IN_LINE)
                again = self.launcher.status({job.handle: job.id}, session=session)[job.handle].liveness
                if not ended_try or again == Liveness.RUNNING:
                    continue
                ended = f"task process ended, task {state}"
            elif status.liveness == Liveness.LOST:
                self._evict(job, state, cycle)
                changed = True
                continue
            elif status.liveness == Liveness.NEVER_STARTED and job.state == JobState.RUNNING.value:
                self.launcher.forget(job.handle, session=session)  # a late delivery is refused there
                transitions.launch_failed(job, f"not started by host {job.host} in time; launched again", session=session)
                self.log.warning("%s was never started on %s; it goes back to its place", job.ti_label(), job.host)
                changed = True
                continue
            else:
                ended = f"exit code {status.rc}" if status.rc is not None else None
            if gang is not None and gang.ending:
                self._end_gang(job, gang, state, cycle)
            else:
                self.launcher.forget(job.handle, session=session)
                self._settle(job, state, ended, cycle)
            changed = True
        return changed

    def watch_gangs(self, cycle: Cycle) -> bool:
        """Start the members of running gangs, and watch them (:class:`~.gangs.Gangs`)."""
        session, changed = cycle.session, False
        gangs = session.scalars(
            select(QuotaJob)
            .where(QuotaJob.state == JobState.RUNNING.value, QuotaJob.nodes > 1, QuotaJob.queue_name.in_(cycle.locked))
            .with_for_update(skip_locked=True)
        ).all()
        for job in gangs:
            gang = GangState.of(job)
            if not gang.nodes:
                continue
            changed |= self.gangs.start_members(job, gang, lambda node: task_env(job, node.host, node.devices, cycle), session)
            changed |= self.gangs.watch(job, gang, cycle.now, session)
        return changed

    def _end_gang(self, job: QuotaJob, gang: GangState, state: str | None, cycle: Cycle) -> None:
        """None of the nodes of a gang that the executor ended runs: it goes back to its place without
        using a retry, or its task failed past its start limit."""
        why, failed = self.gangs.after_end(job, gang, cycle.now, cycle.session)
        if failed:  # its task instance is failed already, with why
            self.launcher.forget(job.handle, session=cycle.session)
            transitions.fail_gang_start(job, why, now=cycle.now, session=cycle.session)
        else:
            self._evict(job, state, cycle, why=why)  # forgets the launch

    def _settle(self, job: QuotaJob, state: str | None, ended: str | None, cycle: Cycle) -> None:
        """The job's process is gone: free its devices; what Airflow hears of it is :meth:`reports`'s."""
        session = cycle.session
        if job.state == JobState.STOPPING.value and job.preempt_fail_message:
            fail_ti(job, job.preempt_fail_message, session)
            transitions.fail_at_limit(job, now=cycle.now, session=session)
        elif job.state == JobState.STOPPING.value and state in BACK_IN_LINE | {TaskInstanceState.RUNNING}:
            if state == TaskInstanceState.RUNNING:
                # Killed while it started (its task instance was still queued at the deadline): the
                # try ended by preemption all the same, so it uses no retry.
                set_ti_state(job, TaskInstanceState.UP_FOR_RESCHEDULE, from_states=[TaskInstanceState.RUNNING], session=session)
                state = TaskInstanceState.UP_FOR_RESCHEDULE
            requeued = state == TaskInstanceState.QUEUED and bool(job.workload)
            ti = (job.dag_id, job.run_id, job.task_id, job.map_index)
            saved = self.checkpoints.last_at(job.id, ti, job.started_at, fresh=True)
            transitions.settle_stopped(job, requeued=requeued, checkpoint_at=saved, session=session)
        elif job.state == JobState.RUNNING.value and state == TaskInstanceState.QUEUED and queued_again(job, session=session):
            transitions.finish_queued_again(job, ended or "process killed", now=cycle.now, session=session)
        else:
            transitions.finish(job, ended or "process killed", killed=ended is None, now=cycle.now, session=session)

    def reports(self, cycle: Cycle) -> list[tuple[TaskInstanceKey, Report]]:
        """What this scheduler must tell Airflow of the jobs of the task instances it queued,
        whichever scheduler settled them (Airflow heeds an executor event only from the scheduler
        that queued the task, ``queued_by_job_id``; a gone scheduler's task instances wait to be
        adopted): (key, report), :attr:`Report.RELEASED` to stop counting it as running, no event.

        Delivery is at least once: Airflow drops an event whose task instance another transaction
        has locked at that moment (``skip_locked``), and a task whose process ended before it
        started would then stay queued for ever. So a report is kept, and sent again every
        :data:`REPORT_AGAIN_S`, until the task instance has left the try (a second event for a
        settled try is ignored)."""
        ti = TaskInstance
        query = (
            select(QuotaJob, ti.state, ti.try_number)
            .outerjoin(ti, and_(*ti_filter(QuotaJob)))
            .where(QuotaJob.report.is_not(None))
        )
        if cycle.scheduler_job is not None:
            query = query.where(or_(ti.queued_by_job_id == cycle.scheduler_job, ti.queued_by_job_id.is_(None)))
        now = time.monotonic()
        reports: list[tuple[TaskInstanceKey, Report]] = []
        for job, state, try_number in cycle.session.execute(query.with_for_update(of=QuotaJob, skip_locked=True)).all():
            key = ti_key(job)
            if job.report == Report.RELEASED.value:
                reports.append((key, Report.RELEASED))
                job.report = None
                continue
            last = self._reported.get(job.id)
            if last is None or now - last >= REPORT_AGAIN_S:
                last = now
                reports.append((key, Report(job.report)))
            if try_number == job.try_number and state in _IN_TRY:
                self._reported[job.id] = last  # Airflow has not acted on it (yet)
            else:
                job.report = None
                self._reported.pop(job.id, None)
        return reports

    def handed_over(self, cycle: Cycle) -> list[TaskInstanceKey]:
        """Task instances that another scheduler queued again (after a preemption settled
        elsewhere): that scheduler's executor holds them now, this one stops counting them."""
        if cycle.scheduler_job is None or cycle.now - self._last_handover_check < HANDOVER_CHECK_EVERY_S:
            return []
        self._last_handover_check = cycle.now
        ti = TaskInstance
        rows = cycle.session.execute(
            select(ti.dag_id, ti.task_id, ti.run_id, ti.try_number, ti.map_index).where(
                ti.queued_by_job_id != cycle.scheduler_job,
                ti.state.in_([TaskInstanceState.QUEUED, TaskInstanceState.RUNNING, TaskInstanceState.UP_FOR_RESCHEDULE]),
            )
        )
        return [TaskInstanceKey(*row) for row in rows]

    def _evict(self, job: QuotaJob, state: str | None, cycle: Cycle, *, why: str | None = None) -> None:
        """The job's host is lost (or its gang ended, ``why``): stop its task instance without a retry
        and put the job back in line. A supervisor that is still alive over there sees 409 on its
        next heartbeat and stops."""
        why, session = why or f"host {job.host} lost", cycle.session
        self.launcher.forget(job.handle, session=session)
        if job.state == JobState.STOPPING.value and job.preempt_fail_message:
            self._settle(job, state, None, cycle)
            return
        if state == TaskInstanceState.RUNNING:
            set_ti_state(job, TaskInstanceState.UP_FOR_RESCHEDULE, from_states=[TaskInstanceState.RUNNING], session=session)
            state = TaskInstanceState.UP_FOR_RESCHEDULE
        requeued = state == TaskInstanceState.QUEUED and bool(job.workload)
        transitions.evict(job, requeued=requeued, why=why, session=session)
        self.log.warning("Evicted %s: %s; it waits at its original place", job.ti_label(), why)

    def enforce_deadlines(self, cycle: Cycle) -> bool:
        """Past its grace period, a stopping task is set to up_for_reschedule so that its supervisor
        ends it (or to failed, past its preemption limit); it is killed if that does not work."""
        now, session = cycle.now, cycle.session
        changed = False
        stopping = session.scalars(
            select(QuotaJob)
            .where(QuotaJob.state == JobState.STOPPING.value, QuotaJob.queue_name.in_(cycle.locked))
            .with_for_update()
        ).all()
        for job in stopping:
            if job.forced_at is not None:
                if now - job.forced_at > FORCE_KILL_AFTER_S and job.handle:
                    self.log.warning("Killing %s: still running after its state was changed", job.ti_label())
                    self.launcher.kill(job.handle, session=session)
                continue
            if job.preempt_deadline is None or now < job.preempt_deadline:
                continue
            target = TaskInstanceState.FAILED if job.preempt_fail_message else TaskInstanceState.UP_FOR_RESCHEDULE
            # A task still starting (queued) is moved too: its start is then refused (409) and it
            # ends cleanly. Killing it instead races its start, and a task killed just after it
            # reported running fails, using a retry.
            set_ti_state(job, target, from_states=[TaskInstanceState.RUNNING, TaskInstanceState.QUEUED], session=session)
            transitions.force_stop(job, target=target.value, now=now, session=session)
            changed = True
            self.log.info("Grace period over for %s: task set to %s", job.ti_label(), target.value)
        return changed

    def keep_queued_alive(self, cycle: Cycle) -> bool:
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
        # Waiting jobs, and launched ones whose task has not reported running yet (a slow start);
        # correlated, not a list of keys: ten thousand keys in an IN clause are too deep for PostgreSQL.
        waiting = (
            select(QuotaJob.id)
            .where(
                QuotaJob.dag_id == TaskInstance.dag_id,
                QuotaJob.run_id == TaskInstance.run_id,
                QuotaJob.task_id == TaskInstance.task_id,
                QuotaJob.map_index == TaskInstance.map_index,
                QuotaJob.state.in_([JobState.PENDING.value, JobState.RUNNING.value, JobState.STOPPING.value]),
                QuotaJob.workload.is_not(None),
            )
            .exists()
        )
        result = cycle.session.execute(
            update(TaskInstance)
            .where(
                waiting,
                TaskInstance.state == TaskInstanceState.QUEUED,
                TaskInstance.queued_dttm < cutoff,
            )
            .values(queued_dttm=datetime.now(timezone.utc))
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount)

    def fail_tasks_on_missing_pools(self, cycle: Cycle) -> bool:
        """Fail our tasks whose pool is neither a quota nor an Airflow pool.

        Airflow never queues a task whose pool does not exist, so a task naming an unknown quota as
        its pool would otherwise wait for ever without a word (quota pools exist: _sync_pools).
        """
        session = cycle.session
        executor = TaskInstance.executor.in_(self.executor_names)
        if self.default_executor:
            executor = or_(executor, TaskInstance.executor.is_(None))
        tis = session.scalars(
            select(TaskInstance).where(
                TaskInstance.state == TaskInstanceState.SCHEDULED,
                TaskInstance.pool.not_in(select(Pool.pool)),
                executor,
            )
        ).all()
        quotas = ", ".join(q.name for queue in cycle.quota_file.queues for q in queue.quotas)
        for ti in tis:
            message = (
                f"pool: {ti.pool!r} is not one of the quotas {quotas} (nor an Airflow pool), "
                "so this task could never be queued"
            )
            where = [TaskInstance.id == ti.id, TaskInstance.state == TaskInstanceState.SCHEDULED]
            mark_failed(where, ti.key, ti.key, message, session)
        return bool(tis)


def _lock_row(session: Session, job_id: int) -> QuotaJob:
    """The job as it is now, locked until this cycle commits: the other scheduler may have settled
    it, or queued its task again, since this cycle read it."""
    return session.get(QuotaJob, job_id, with_for_update=True, populate_existing=True)
