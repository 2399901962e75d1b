"""A task never runs twice: every process of a launch dies with the ``airflow quota worker`` that
started it, and a worker that starts again on a host ends what an earlier one left before it
registers the host. Real fleet (tests/fleet_support.py); the worker is killed as a crash or an
operator would, ``kill -9 -PGID``."""

from __future__ import annotations

import os
import signal

from airflow_quota_provider.executors.containment import children, descendants, process_alive
from tests.fleet.conftest import HOST_LOST_AFTER_S
from tests.fleet.test_fleet import assert_no_device_held_twice
from tests.integration_support import wait_for

TASK = "wd_train"


def _starts(fleet) -> list[dict]:
    return [r for r in fleet.task_records() if r.get("name") == TASK and r["event"] == "start"]


def _job(fleet) -> dict:
    return fleet.sql("SELECT * FROM quota_job WHERE dag_id='worker_death' AND task_id=?", TASK)[0]


def _launch(fleet, job_id: int, host: str) -> dict:
    """The launch of ``job_id`` that ``host``'s worker has started."""
    rows = fleet.sql("SELECT * FROM quota_launch WHERE job_id=? AND host=? AND state='started'", job_id, host)
    return rows[0] if rows else None


def _holds_gpus(fleet, job_id: int, host: str) -> bool:
    return bool(fleet.sql("SELECT 1 FROM quota_device_allocation WHERE job_id=? AND host=?", job_id, host))


def _kill_worker_group(fleet, host: str) -> None:
    """``kill -9 -PGID`` of the host's worker: its main process and its pool processes at once."""
    proc = fleet.workers.pop(host)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_launch_dies_with_its_worker_and_a_restarted_worker_ends_what_is_left_before_it_registers(fleet):
    run = fleet.trigger("worker_death")
    start = wait_for(lambda: _starts(fleet), f"{TASK} running", timeout=240, on_timeout=lambda: fleet.tail("scheduler"))[0]
    job = _job(fleet)
    first = job["host"]
    assert start["host"] == first
    launch = wait_for(lambda: _launch(fleet, job["id"], first), "its launch started")
    tree = descendants(launch["worker_pid"])  # everything the pool process started for the launch
    assert start["pid"] in tree and len(tree) >= 3, tree  # at least the command and the process it set loose

    _kill_worker_group(fleet, first)

    def launch_gone() -> bool:
        held = _holds_gpus(fleet, job["id"], first)  # first: a process seen alive after this was alive then
        alive = [pid for pid in tree if process_alive(pid)]
        assert held or not alive, f"the GPUs of job {job['id']} on {first} were handed out while {alive} still ran"
        return not alive

    # The bound: gone before the scheduler gives up the host and places the job elsewhere.
    wait_for(launch_gone, f"every process of the launch on {first} to die with its worker",
             timeout=HOST_LOST_AFTER_S, interval=0.05)

    # Evicted once the host is lost, the job runs again on another host; the host comes back.
    again = wait_for(lambda: _starts(fleet)[1:], f"{TASK} running on another host", timeout=HOST_LOST_AFTER_S + 120,
                     on_timeout=lambda: fleet.unfinished("worker_death", run))[0]
    second = again["host"]
    assert second != first
    fleet.start_worker(first)

    # A launch its guard cannot end (stopped: its watch never runs) outlives the worker, until the
    # worker starts again on that host.
    launch = wait_for(lambda: _launch(fleet, job["id"], second), "its launch started on the second host")
    [guard] = [int(pid) for pid in children(launch["worker_pid"])]
    os.kill(guard, signal.SIGSTOP)
    left = [guard, *descendants(guard)]
    _kill_worker_group(fleet, second)
    assert again["pid"] in left and all(process_alive(pid) for pid in left), left

    fleet.start_worker(second)  # returns once the worker takes tasks: it registered the host before
    assert not [pid for pid in left if process_alive(pid)], "the restarted worker registered while its leftovers ran"
    log = fleet.tail(f"worker-{second}", chars=200_000)
    ended = log.rfind(f"Ended the launches {job['id']} left running by an earlier worker of host {second}")
    assert 0 <= ended < log.rfind(f"GPU host {second} serves job queue"), log[-4000:]

    # The launch whose pool process died is ended by the host's heartbeat, or cancelled when the
    # scheduler lost the host first: it does not hold the job's GPUs for ever.
    wait_for(lambda: not _launch(fleet, job["id"], second), "the dead launch to end", timeout=HOST_LOST_AFTER_S + 60)
    fleet.api("PATCH", f"/dags/worker_death/dagRuns/{run}", {"state": "failed"})
    assert_no_device_held_twice(fleet)
