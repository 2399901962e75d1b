"""The GPU host's side of the Celery launcher: our Celery task and two remote-control commands.

``airflow quota worker`` imports this module into ``airflow celery worker`` before the worker
starts, so that the task is registered on Airflow's Celery app and the control commands in the
worker's main process. Each host consumes a Celery queue of its own (:func:`host_queue`).

- :func:`execute_quota_workload` runs one launch: it refuses a launch the scheduler cancelled (a
  message redelivered after its host was lost), runs the task supervisor with
  ``BaseExecutor.run_workload`` in an environment carrying ``CUDA_VISIBLE_DEVICES`` and the
  ``QUOTA_*`` variables, restores the worker's environment (a prefork child runs many tasks), and
  records the exit code. How the try ended is the task instance's state, never this task's result.
  As soon as the task and everything it started are gone it says so (``task_exited``): Airflow's
  supervisor may notice its task's exit a whole heartbeat late, and the GPUs need not wait for it
  (as :class:`~airflow_quota_provider.executors.local_launcher.LocalLauncher` does locally). The
  worker runs more pool processes than GPUs, so a lingering supervisor does not hold up the next
  launch; the GPUs, not the pool, gate what runs.
- ``quota_notify`` writes a preemption notice where the task polls for it (``QUOTA_PREEMPT_FILE``).
- ``quota_kill`` kills what a launch's worker process started (the task and its descendants).

The pool process is a child subreaper while it runs a launch, so what the task starts in sessions of
its own stays its descendant; when the task is done it ends all of it (:func:`end_descendants`)
before it records the launch's end, which is what frees the GPUs.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from celery.signals import worker_process_init
from celery.worker.control import control_command

from airflow.providers.celery.executors.celery_executor_utils import app
from airflow_quota_provider.executors.containment import (
    become_subreaper,
    children as _children,
    end_descendants,
    kill_tree,
    stat_field as _stat_field,
)
from airflow_quota_provider.executors.local_launcher import LocalLauncher

log = logging.getLogger(__name__)

TASK_NAME = "quota_execute_workload"
TASK_EXIT_POLL_S = 0.2
RECORD_RETRY_S = 600.0
"""How long a launch's task exit and end are retried while the database is unreachable."""
STATE_DIR_ENV = "QUOTA_WORKER_STATE_DIR"
"""The worker's job directory root (preempt notices), set by ``airflow quota worker``."""


def host_queue(host: str) -> str:
    """The Celery queue that only ``host``'s worker consumes."""
    return f"quota-host-{host}"


def _jobs() -> LocalLauncher:
    return LocalLauncher(Path(os.environ.get(STATE_DIR_ENV) or "quota"))


@worker_process_init.connect
def _fresh_connections(**_) -> None:
    """A forked pool process must not share the parent's database connections."""
    from airflow import settings

    if settings.engine is not None:
        settings.engine.dispose(close=False)


@app.task(name=TASK_NAME, bind=True, acks_late=True)
def execute_quota_workload(self, workload_json: str, job_id: int, env: dict[str, str]) -> int:
    from airflow.executors.base_executor import BaseExecutor
    from airflow.executors.workloads import ExecuteTask
    from airflow.utils.session import create_session
    from airflow_quota_provider.models.host import end_launch, start_launch

    handle = self.request.id
    with create_session() as session:
        if not start_launch(handle, worker_pid=os.getpid(), session=session):
            log.warning("Launch %s of job %s was cancelled or is unknown: not running it", handle, job_id)
            return -1
    jobs = _jobs()
    jobs.job_dir(job_id).mkdir(parents=True, exist_ok=True)
    jobs.preempt_file(job_id).unlink(missing_ok=True)
    saved = dict(os.environ)
    done = threading.Event()
    rc = 1
    try:
        os.environ.update(env)
        os.environ["QUOTA_PREEMPT_FILE"] = str(jobs.preempt_file(job_id))
        become_subreaper()  # what the task leaves behind stays ours, and is ended below
        workload = ExecuteTask.model_validate_json(workload_json)
        log.info("[%s] job %s on GPUs %s: %s", handle, job_id, env.get("CUDA_VISIBLE_DEVICES"), workload.display_name)
        threading.Thread(target=_report_task_exit, args=(handle, done), name="quota-task-exit", daemon=True).start()
        rc = int(BaseExecutor.run_workload(workload, subprocess_logs_to_stdout=False) or 0)
    except Exception:
        log.exception("[%s] the task supervisor of job %s failed", handle, job_id)
    finally:
        done.set()
        os.environ.clear()
        os.environ.update(saved)
        end_descendants()  # nothing the task started outlives its launch: SIGTERM, grace, SIGKILL
        _record(handle, "its end", lambda session: end_launch(handle, rc=rc, session=session))
    return rc


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


def _report_task_exit(handle: str, done: threading.Event) -> None:
    """Once this process's task child has come and gone with everything under it, record
    ``task_exited`` (the executor frees the GPUs when the task instance says the try ended)."""
    from airflow_quota_provider.models.host import task_exited

    me, seen = os.getpid(), False
    while not done.wait(TASK_EXIT_POLL_S):
        alive = [c for c in _children(me) or () if _stat_field(c, 0) not in (None, "Z")]
        if alive:
            seen = True
        elif seen:
            _record(handle, "that the task exited", lambda session: task_exited(handle, session=session))
            return


@control_command(args=[("job_id", int), ("notice", json.loads)], signature="<job_id> <notice-json>")
def quota_notify(state, job_id: int, notice: dict) -> dict:
    """Write job ``job_id``'s preemption notice on this host."""
    path = _jobs().write_preempt_notice(int(job_id), notice)
    return {"ok": str(path)}


@control_command(args=[("worker_pid", int)], signature="<worker-pid>")
def quota_kill(state, worker_pid: int) -> dict:
    """SIGKILL everything the pool process ``worker_pid`` started for its launch (not the pool
    process itself: it records the exit and takes the next task)."""
    children = _children(int(worker_pid)) or []
    for child in children:
        kill_tree(int(child))
    return {"ok": len(children)}
