"""Two schedulers on PostgreSQL and the faults a fleet lives with (real PostgreSQL, Redis, two
schedulers, an api-server, a dag-processor and three ``airflow quota worker`` hosts; every fault is
injected by the test itself).

One workload of ``QUOTA_HA_TASKS`` tasks over four quotas (100 here, to fit CI's 30 minutes; run
with ``QUOTA_HA_TASKS=500`` for the full size, as ``benchmarks/ha.py`` does) runs while, one after
the other, a scheduler is killed with SIGKILL (and a fresh one started), PostgreSQL is restarted,
Redis is restarted and the api-server is restarted. Then the audit log is
replayed: at no instant may allocations exceed a host's GPUs, the job queue's capacity or a quota's
capacity plus what it may borrow; no device is held twice; every task succeeded on its first try
(a preemption that used a retry would have failed it: retries=0).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.fleet.test_fleet import assert_no_device_held_twice
from tests.fleet_support import Fleet, running_fleet
from tests.integration_support import free_port, wait_for

DAGS = Path(__file__).parent / "dags"
TASKS = int(os.environ.get("QUOTA_HA_TASKS", "100"))
HOSTS = ("gpu-a", "gpu-b", "gpu-c")
GPUS_PER_HOST = 4
CAPACITY = {"q0": 3, "q1": 3, "q2": 3, "q3": 3}
QUOTAS = "queues:\n  - name: gpu-fleet\n    capacity: 12\n    quotas:\n" + "".join(
    f"      - {{name: {name}, capacity: {gpus}, sharing: lend_and_borrow, grace_period_s: 2}}\n"
    for name, gpus in CAPACITY.items()
)
SKEWED_CLOCK = Path(__file__).parent / "skewed_clock"


def skewed(env: dict[str, str], seconds: float) -> dict[str, str]:
    """The environment of a process whose wall clock runs ``seconds`` ahead (see skewed_clock/)."""
    return {"PYTHONPATH": os.pathsep.join([str(SKEWED_CLOCK), env["PYTHONPATH"]]), "QUOTA_CLOCK_SKEW_S": str(seconds)}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Fleet:
    home = tmp_path_factory.mktemp("airflow-faults")
    with running_fleet(
        home,
        quota_file=QUOTAS,
        dags_folder=DAGS,
        hosts=HOSTS,
        gpus_per_host=GPUS_PER_HOST,
        port=free_port(18300, 18349, also=50),
        redis_db=9,
        extra_env={
            "QUOTA_HA_TASKS": str(TASKS),
            # A scheduler silent this long is declared dead and its task instances adopted; on two
            # busy cores a live scheduler's heartbeat can lag 15 s.
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "40",
            "AIRFLOW__CORE__PARALLELISM": "1024",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.25",
            "AIRFLOW__QUOTA__HOST_HEARTBEAT_S": "1",
            "AIRFLOW__QUOTA__HOST_LOST_AFTER_S": "20",
            "AIRFLOW__QUOTA__LAUNCH_START_TIMEOUT_S": "20",
            # Tasks ride out an api-server restart (about 30 s on two busy cores) with their client's
            # retries: 1, 2, 4, ... 64 s (Airflow's default 5 gives up after 31 s).
            "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "8",
        },
    ) as instance:
        instance.start_process("scheduler-2", "scheduler")
        yield instance


# ------------------------------------------------------------------------------------------ faults


def restart_postgres() -> None:
    version = sorted(os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".")])[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast"],
                   check=True, timeout=120)


def restart_redis() -> None:
    subprocess.run(["redis-cli", "-h", "127.0.0.1", "shutdown", "nosave"], timeout=30)
    wait_for(lambda: subprocess.run(["redis-cli", "-h", "127.0.0.1", "ping"], capture_output=True).returncode != 0,
             "Redis to stop", timeout=30)
    subprocess.run(["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
                    "--save", "", "--appendonly", "no"], check=True, timeout=30)


def restart_api_server(fleet: Fleet) -> None:
    proc = fleet.procs.pop("api-server")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    fleet.start_process("api-server", "api-server", "--port", str(fleet.port), "--host", "127.0.0.1")
    wait_for(fleet._api_up, "the api-server again", timeout=120)


def kill_scheduler(fleet: Fleet, name: str) -> None:
    """SIGKILL the scheduler process alone (its log server lives on, as after a real crash)."""
    proc = fleet.procs.pop(name)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    fleet._orphan_groups.append(proc.pid)


# ----------------------------------------------------------------------------------------- replay


def replay_allocations(fleet: Fleet) -> dict[str, int]:
    """Replay admissions and releases in the order they were written (the job queue's lock orders
    them): at no instant may a host, the queue or a quota hold more than it may. Returns the most
    GPUs each quota held at once."""
    gpus_of_job: dict[int, tuple[str, str, int]] = {}
    host_used: dict[str, int] = {}
    quota_used = {name: 0 for name in CAPACITY}
    peak = dict(quota_used)
    for e in fleet.sql("SELECT * FROM quota_event WHERE kind IN ('admitted', 'released') ORDER BY id"):
        n = len([d for d in (e["devices"] or "").split(",") if d])
        if e["kind"] == "admitted":
            assert e["job_id"] not in gpus_of_job, f"job {e['job_id']} admitted twice without a release"
            gpus_of_job[e["job_id"]] = (e["host"], e["quota"], n)
            host_used[e["host"]] = host_used.get(e["host"], 0) + n
            quota_used[e["quota"]] += n
            assert host_used[e["host"]] <= GPUS_PER_HOST, f"event {e['id']}: host {e['host']} over-admitted"
            assert sum(quota_used.values()) <= 12, f"event {e['id']}: the job queue over-admitted: {quota_used}"
            # lend_and_borrow without limits: a quota may hold what the others leave idle, no more.
            for name, used in quota_used.items():
                others_idle = sum(max(0, CAPACITY[o] - quota_used[o]) for o in CAPACITY if o != name)
                assert used <= CAPACITY[name] + others_idle, f"event {e['id']}: quota {name} over-admitted: {quota_used}"
            peak[e["quota"]] = max(peak[e["quota"]], quota_used[e["quota"]])
        else:
            host, quota, held = gpus_of_job.pop(e["job_id"])
            assert (host, held) == (e["host"], n), f"event {e['id']} releases what job {e['job_id']} did not hold"
            host_used[host] -= n
            quota_used[quota] -= n
    assert gpus_of_job == {}, f"still held after every job ended: {gpus_of_job}"
    return peak


def _finished(fleet: Fleet) -> int:
    return fleet.sql("SELECT count(*) AS n FROM quota_job WHERE state = 'finished'")[0]["n"]


def _scheduler_ids(fleet: Fleet) -> list[int]:
    """The running schedulers' job ids, oldest first."""
    return [r["id"] for r in fleet.sql("SELECT id FROM job WHERE job_type = 'SchedulerJob' AND state = 'running' ORDER BY id")]


def _beating_schedulers(fleet: Fleet) -> list[int]:
    """The running schedulers whose heartbeat is at most 15 s old (the database's clock)."""
    return [r["id"] for r in fleet.sql(
        "SELECT id FROM job WHERE job_type = 'SchedulerJob' AND state = 'running' "
        "AND latest_heartbeat > now() - interval '15 seconds'")]


def _anchor_owner(fleet: Fleet) -> int | None:
    """The scheduler (job id) that queued a long task now running, if one is."""
    rows = fleet.sql("SELECT queued_by_job_id FROM task_instance WHERE dag_id = 'ha_anchor' AND state = 'running' "
                     "AND queued_by_job_id IS NOT NULL")
    return rows[0]["queued_by_job_id"] if rows else None


def _unsettled(fleet: Fleet) -> str:
    """Every job still holding or waiting, with its launch and its events: what a timeout needs."""
    lines = []
    for j in fleet.sql("SELECT j.id, j.dag_id, j.task_id, j.state, j.host, j.handle, j.report, j.forced_at, "
                       "l.state AS launch, l.worker_pid FROM quota_job j LEFT JOIN quota_launch l ON l.handle = j.handle "
                       "WHERE j.state NOT IN ('finished', 'failed')"):
        lines.append(f"job {dict(j)}")
        lines += [f"  event {e['kind']} at {e['at']:.1f}: {e['message']}"
                  for e in fleet.sql("SELECT * FROM quota_event WHERE job_id = ? ORDER BY id", j["id"])]
    return "\n".join(lines)


def _admitters(fleet: Fleet) -> set[str]:
    return {e["message"] for e in fleet.events("admitted") if e["message"]}


# ------------------------------------------------------------------------------------------ tests


def test_two_schedulers_through_every_fault_admit_nothing_twice_and_lose_nothing(fleet):
    low = fleet.trigger("ha_low")
    wait_for(lambda: len(fleet.events("admitted")) >= 8, "the fleet to fill", timeout=300,
             on_timeout=lambda: fleet.stacks("scheduler", "scheduler-2"))
    high = fleet.trigger("ha_high")

    def at(fraction: float) -> None:
        wait_for(lambda: _finished(fleet) >= fraction * TASKS, f"{fraction:.0%} of the tasks to finish",
                 timeout=600, interval=2, on_timeout=lambda: fleet.stacks("scheduler", "scheduler-2"))

    at(0.15)
    # Both schedulers alive and beating before one is killed, or the survivor could never adopt (a
    # hung one shows where it waits).
    wait_for(lambda: len(_beating_schedulers(fleet)) == 2, "both schedulers to heartbeat", timeout=60,
             on_timeout=lambda: fleet.stacks("scheduler", "scheduler-2"))
    # Kill a scheduler while it holds a long task: its short ones may all end (run on by the other
    # scheduler) before it is declared dead, and then there is nothing to adopt.
    anchor = fleet.trigger("ha_anchor")
    owner = wait_for(lambda: _anchor_owner(fleet), "a long task to run", timeout=300,
                     on_timeout=lambda: fleet.stacks("scheduler", "scheduler-2"))
    name = "scheduler" if owner == _scheduler_ids(fleet)[0] else "scheduler-2"  # "scheduler" started first
    kill_scheduler(fleet, name)
    # Airflow adopts the dead scheduler's task instances once it has been silent for
    # scheduler_health_check_threshold (40 s here); then a fresh scheduler takes its place.
    wait_for(lambda: fleet.events("adopted"), "the survivor to adopt the dead scheduler's tasks", timeout=240,
             interval=2, on_timeout=lambda: fleet.stacks("scheduler" if name == "scheduler-2" else "scheduler-2", "api-server"))
    fleet.start_process(name, "scheduler")
    at(0.35)
    # Airflow's scheduler and dag-processor exit when the database stays away longer than their
    # retries, as a restart can on a busy machine; the fleet's supervisor starts them again.
    with fleet.restarting("scheduler", "scheduler-2", "dag-processor"):
        restart_postgres()
        at(0.55)
        restart_redis()
        at(0.75)
    restart_api_server(fleet)

    assert fleet.wait_run("ha_low", low, timeout=900) == "success", fleet.tail("scheduler")
    assert fleet.wait_run("ha_high", high, timeout=600) == "success", fleet.tail("scheduler")
    assert fleet.wait_run("ha_anchor", anchor, timeout=600) == "success", fleet.tail("scheduler")

    tis = fleet.sql("SELECT task_id, state, try_number FROM task_instance WHERE dag_id IN ('ha_low', 'ha_high')")
    assert len(tis) == TASKS
    assert {(t["state"], t["try_number"]) for t in tis} == {("success", 1)}, "no retry used, nothing failed"
    # A task reports success itself; its job is settled once its host has recorded the process's
    # end and a scheduler has seen it (a heartbeat or two later).
    unsettled = "SELECT id, state, report, host, handle, task_id FROM quota_job WHERE state NOT IN ('finished')"
    wait_for(lambda: not fleet.sql(unsettled), "every job to be settled", timeout=120,
             on_timeout=lambda: f"{[dict(r) for r in fleet.sql(unsettled)]}\n{fleet.tail('scheduler')}")

    peak = replay_allocations(fleet)
    assert_no_device_held_twice(fleet)
    assert len(fleet.events("preempted")) > 0, "the workload must preempt, or this proves nothing about preemption"
    assert max(peak[q] - CAPACITY[q] for q in CAPACITY) > 0, "some quota must have borrowed"
    assert len(_admitters(fleet)) >= 2, f"both schedulers must have decided: {_admitters(fleet)}"
    adopted = fleet.events("adopted")
    assert all(e["message"].startswith("by scheduler job ") for e in adopted), [e["message"] for e in adopted]
    # Each outage is logged once, not every heartbeat.
    for name in ("scheduler", "scheduler-2"):
        assert fleet.tail(name, chars=10**8).count("QuotaExecutor cycle failed") <= 3, fleet.tail(name)


def test_a_scheduler_clock_30s_ahead_does_not_protect_its_jobs_from_preemption(fleet):
    """The skewed scheduler admits q0's jobs alone; then it stops and the other one must reclaim
    GPUs from one of them for q1's ``urgent`` at once, not 30 s later (without min_runtime_s a job
    is a candidate from its start, and its start is the database's time)."""
    for name in ("scheduler", "scheduler-2"):
        if name in fleet.procs:
            kill_scheduler(fleet, name)
    fleet.start_process("scheduler-skewed", "scheduler", env=skewed(fleet.env, 30))
    low = fleet.trigger("skew_low")
    # Launched, not only admitted: this case is about the clock. A scheduler stopped between an
    # admission and its launch leaves jobs that are recovered only after launch_start_timeout_s
    # (tests/executors/test_unrecorded_launch.py).
    launched = "SELECT count(*) AS n FROM quota_job WHERE dag_id = 'skew_low' AND handle IS NOT NULL"
    wait_for(lambda: fleet.sql(launched)[0]["n"] == 3, "the skewed scheduler to fill the fleet",
             timeout=240, on_timeout=lambda: fleet.tail("scheduler-skewed"))
    fleet.procs.pop("scheduler-skewed").send_signal(signal.SIGTERM)
    fleet.start_process("scheduler", "scheduler")
    high = fleet.trigger("skew_high")
    wait_for(lambda: fleet.events("preempted", dag_id="skew_low"), "a skewed job to be preempted", timeout=180,
             on_timeout=lambda: fleet.tail("scheduler"))
    (preempted, *_) = fleet.events("preempted", dag_id="skew_low")
    (submitted,) = fleet.events("submitted", dag_id="skew_high")
    (job,) = fleet.sql(
        "SELECT j.started_at, EXTRACT(EPOCH FROM t.queued_dttm) AS queued FROM quota_job j JOIN task_instance t "
        "ON t.dag_id = j.dag_id AND t.run_id = j.run_id AND t.task_id = j.task_id WHERE j.id = ?", preempted["job_id"])
    # Admitted just after Airflow queued it (Airflow's own time); by the skewed clock, ~30 s after.
    assert 0 <= job["started_at"] - float(job["queued"]) < 15, dict(job)
    # Reclaimed in the cycle after urgent arrived, not once the skewed start time had passed.
    assert preempted["at"] - submitted["at"] < 12, (dict(preempted), dict(submitted))
    assert wait_for(lambda: fleet.sql("SELECT state FROM dag_run WHERE run_id = ? AND state IN ('success', 'failed')", high),
                    "skew_high to finish", timeout=240, interval=2,
                    on_timeout=lambda: _unsettled(fleet) + fleet.tail("scheduler"))[0]["state"] == "success"
    assert fleet.tis("skew_low", low)[preempted["task_id"]]["try_number"] == 1, "the preemption used no retry"
