"""The GPU host's side of the Celery launcher: our Celery task and two remote-control commands.

``airflow quota worker`` imports this module into ``airflow celery worker`` before the worker
starts, so that the task is registered on Airflow's Celery app and the control commands in the
worker's main process. Each host consumes a Celery queue of its own (:func:`host_queue`).

- :func:`execute_quota_workload` runs one launch: it refuses a launch the scheduler cancelled (a
  message redelivered after its host was lost), starts the launch's guard and task supervisor
  (``BaseExecutor.run_workload``) as :class:`~airflow_quota_provider.executors.local_launcher.LocalLauncher`
  does, in an environment carrying ``CUDA_VISIBLE_DEVICES`` and the ``QUOTA_*`` variables (the pool
  process's own stays as it was: a prefork child runs many tasks), and records the exit code. How the try ended is the task instance's state, never this task's result.
  As soon as the task and everything it started are gone, or the task released its GPUs after its
  command (:func:`~airflow_quota_provider.protocol.release_gpus`), it says so (``task_exited``): Airflow's
  supervisor may notice its task's exit a whole heartbeat late, and the GPUs need not wait for it
  (as :class:`~airflow_quota_provider.executors.local_launcher.LocalLauncher` does locally). The
  worker runs more pool processes than GPUs, so a lingering supervisor does not hold up the next
  launch; the GPUs, not the pool, gate what runs.
- :func:`execute_gang_member` runs node N > 0 of a gang (:mod:`.gangs`) the same way: its command
  in place of the task supervisor.
- ``quota_notify`` writes a preemption notice where the task polls for it (``QUOTA_PREEMPT_FILE``).
- ``quota_kill`` kills what a launch's worker process started (the task and its descendants).

The launch is tied to the worker (:mod:`.containment`): its guard, outside the worker's process
group, kills all of the launch as soon as the pool process that started it is gone, whatever killed
the worker (``kill -9 -PGID``, a crash, the OOM killer); a host that starts again or rejoins first
ends whatever of its launches still runs. The pool process is a child subreaper too, so that what a
killed guard leaves is ended (:func:`end_descendants`) before the launch's end is recorded, which is
what frees the GPUs.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from celery.signals import worker_process_init
from celery.worker.control import control_command

from airflow.providers.celery.executors.celery_executor_utils import app
from airflow_quota_provider.executors.containment import (
    become_subreaper,
    children as _children,
    end_descendants,
    kill_tree,
    process_alive,
    wait_for_an_exit,
)
from airflow_quota_provider.executors.gangs import run_member, with_master_port
from airflow_quota_provider.executors.launcher import Liveness
from airflow_quota_provider.executors.local_launcher import MEMBER_LOG, LocalLauncher, supervise_workload, warm_task_client
from airflow_quota_provider.protocol import ENV_CUDA_VISIBLE_DEVICES

log = logging.getLogger(__name__)

TASK_NAME = "quota_execute_workload"
MEMBER_TASK_NAME = "quota_execute_gang_member"
TASK_EXIT_POLL_S = 0.2
"""The longest a launch's watch waits: the exit of its task, supervisor or guard wakes it at once."""
RELEASE_POLL_S = 0.02
RELEASE_WATCH_S = 2.0
"""After what a task started has exited, its watch looks every ``RELEASE_POLL_S`` for this long
for the task releasing its GPUs (:func:`~airflow_quota_provider.protocol.release_gpus`)."""
RECORD_RETRY_S = 600.0
"""How long a launch's task exit and end are retried while the database is unreachable."""
STATE_DIR_ENV = "QUOTA_WORKER_STATE_DIR"
"""The worker's job directory root (preempt notices), set by ``airflow quota worker``."""


def host_queue(host: str) -> str:
    """The Celery queue that only ``host``'s worker consumes."""
    return f"quota-host-{host}"


def jobs() -> LocalLauncher:
    """The launches of this host, kept in its job directories."""
    return LocalLauncher(Path(os.environ.get(STATE_DIR_ENV) or "quota"))


@worker_process_init.connect
def _prepare_pool_process(**_) -> None:
    """A forked pool process must not share the parent's database connections; it readies what its
    launches' supervisors need before the first launch waits on it."""
    from airflow import settings

    if settings.engine is not None:
        settings.engine.dispose(close=False)
    warm_task_client()


@app.task(name=TASK_NAME, bind=True, acks_late=True)
def execute_quota_workload(self, workload_json: str, job_id: int, env: dict[str, str]) -> int | None:
    from airflow.executors.workloads import ExecuteTask
    from airflow.utils.session import create_session
    from airflow_quota_provider.models.host import start_launch

    handle = self.request.id
    env, port = with_master_port(env)  # a gang's node 0: a port free here now
    with create_session() as session:
        if not start_launch(handle, worker_pid=os.getpid(), port=port, session=session):
            log.warning("Launch %s of job %s was cancelled or is unknown: not running it", handle, job_id)
            return -1
    workload = ExecuteTask.model_validate_json(workload_json)
    log.info("[%s] job %s on GPUs %s: %s", handle, job_id, env.get(ENV_CUDA_VISIBLE_DEVICES), workload.display_name)
    return _run_recorded(handle, str(job_id), lambda: supervise_workload(workload), env)


@app.task(name=MEMBER_TASK_NAME, bind=True, acks_late=True)
def execute_gang_member(self, job_id: int, node_rank: int, argv: list[str], cwd: str | None, env: dict[str, str]) -> int | None:
    """Node ``node_rank`` of a gang: node 0's command with this node's variables (:mod:`.gangs`)."""
    from airflow.utils.session import create_session
    from airflow_quota_provider.models.host import launch_key, start_launch

    handle, key = self.request.id, launch_key(job_id, node_rank)
    with create_session() as session:
        if not start_launch(handle, worker_pid=os.getpid(), session=session):
            log.warning("Launch %s of node %s of job %s was cancelled or is unknown: not running it", handle, node_rank, job_id)
            return -1
    log.info("[%s] node %s of job %s on GPUs %s: %s", handle, node_rank, job_id, env.get(ENV_CUDA_VISIBLE_DEVICES), argv)
    log_file = jobs().job_dir(key) / MEMBER_LOG
    return _run_recorded(handle, key, lambda: run_member(argv, cwd, log_file), env)


def _run_recorded(handle: str, key: str, run: Callable[[], int], env: dict[str, str]) -> int | None:
    """Run a launch (:func:`run_launch`) and record its task's exit and its end."""
    from airflow_quota_provider.models.host import end_launch, task_exited

    rc = None
    try:
        rc = run_launch(
            jobs(), key, run, env,
            on_task_exit=lambda: _record(handle, "that the task exited", lambda session: task_exited(handle, session=session)),
        )
    except Exception:
        log.exception("[%s] the launch %s failed", handle, key)
    _record(handle, "its end", lambda session: end_launch(handle, rc=rc, session=session))
    return rc


def run_launch(
    jobs: LocalLauncher, job_id: int | str, run: Callable[[], int], env: dict[str, str], *, on_task_exit: Callable[[], object]
) -> int | None:
    """Run one launch tied to this process and wait until nothing of it is left; returns the
    supervisor's exit code (None: killed). ``on_task_exit`` is called once the task and everything
    it started are gone while the supervisor still finishes."""
    become_subreaper()  # what a killed guard leaves comes here, and is ended below
    guard = jobs.start(job_id, run, env, tied_to_parent=True)
    handle = f"{job_id}:{guard}"
    told = commanding = False
    look_soon_until = 0.0
    try:
        while (status := jobs.status({handle: job_id}, session=None)[handle]).liveness != Liveness.ENDED:
            if status.liveness == Liveness.TASK_EXITED and not told:
                on_task_exit()
                told = True
            # Woken by the exit of the task (the supervisor's children), of what the task started
            # (its command), of the supervisor or of the guard, so the GPUs are reported free at
            # once: a reclaiming owner waits on this. What the task leaves to the supervisor is seen
            # on the next poll.
            supervisor = jobs.supervisor(job_id, guard)
            tasks = [] if supervisor is None else [int(pid) for pid in _children(supervisor) or ()]
            started = [int(pid) for task in tasks for pid in _children(task) or () if process_alive(pid)]
            watched = [pid for pid in [guard, *([supervisor] if supervisor else []), *tasks] if process_alive(pid)] + started
            if started:
                commanding = True
            elif commanding:
                # What the task started is gone: the task may release its GPUs in a moment, which
                # no exit announces (protocol, 5), so it is looked for often for a while.
                commanding, look_soon_until = False, time.monotonic() + RELEASE_WATCH_S
            soon = not told and time.monotonic() < look_soon_until
            wait_for_an_exit(watched, RELEASE_POLL_S if soon else TASK_EXIT_POLL_S)
    finally:
        jobs.forget(handle, session=None)
        end_descendants()  # nothing the launch started outlives it: SIGTERM, grace, SIGKILL
    return status.rc


def _record(handle: str, what: str, write, *, give_up_after_s: float = RECORD_RETRY_S) -> bool:
    """Write ``what`` of a launch, trying again while the database is away (a restart, a failover):
    an end that is never recorded holds the job's GPUs for ever, since this pool process lives on."""
    from airflow.utils.session import create_session

    deadline, pause = time.monotonic() + give_up_after_s, 0.5
    while True:
        try:
            with create_session() as session:
                write(session)
            return True
        except Exception:
            if time.monotonic() + pause > deadline:
                log.exception("[%s] could not record %s; giving up after %.0f s", handle, what, give_up_after_s)
                return False
            log.warning("[%s] could not record %s; trying again in %.1f s", handle, what, pause, exc_info=True)
            time.sleep(pause)
            pause = min(pause * 2, 10.0)


@control_command(args=[("job_id", str), ("notice", json.loads)], signature="<launch-key> <notice-json>")
def quota_notify(state, job_id: str, notice: dict) -> dict:
    """Write the preemption notice of launch ``job_id`` (:func:`~airflow_quota_provider.models.host.launch_key`) on this host."""
    path = jobs().write_preempt_notice(str(job_id), notice)
    return {"ok": str(path)}


@control_command(args=[("worker_pid", int)], signature="<worker-pid>")
def quota_kill(state, worker_pid: int) -> dict:
    """SIGKILL everything the pool process ``worker_pid`` started for its launch (its guard and all
    under it; not the pool process itself: it records the exit and takes the next task)."""
    children = _children(int(worker_pid)) or []
    for child in children:
        kill_tree(int(child))
    return {"ok": len(children)}
