"""A GPU host's heartbeat (``airflow quota worker``): the launches it ends and the proof it gives
before a lost host's GPUs return. Real launches (forked guards), real sessions on a database of the
test's own with the provider's tables."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import sessionmaker

from airflow_quota_provider.cli.worker_command import _beat
from airflow_quota_provider.executors.local_launcher import LocalLauncher
from airflow_quota_provider.models.base import quota_metadata
from airflow_quota_provider.models.host import (
    HostState,
    QuotaHost,
    QuotaLaunch,
    mark_lost_hosts,
    record_launch,
    register_host,
    start_launch,
)
from tests.executors.test_leftovers import JOB, held_launch

HOST = "gpu-a"

WAIT_S = 3.0
"""``[quota] leftover_wait_s`` of the tests that wait for a launch that outlives SIGKILL."""


@pytest.fixture
def db(tmp_path, monkeypatch):
    """Airflow's sessions (``create_session``) on a SQLite database holding the provider's tables."""
    from airflow import settings

    engine = create_engine(f"sqlite:///{tmp_path}/airflow.db")
    quota_metadata.create_all(engine)
    monkeypatch.setattr(settings, "Session", sessionmaker(engine, expire_on_commit=False))
    session = settings.Session()
    register_host(HOST, queues=["fleet"], devices=["0", "1"], celery_name=f"celery@{HOST}", session=session)
    session.commit()
    yield session
    session.close()
    engine.dispose()


@pytest.fixture
def launcher(tmp_path):
    jobs = LocalLauncher(tmp_path / "host", cgroups=False)
    yield jobs
    for job_id in (1, 2, 3):
        if jobs.running(job_id):
            jobs.end_leftovers(timeout_s=30)


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped (a pool process killed with its worker)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _started(session, handle: str, *, job_id: int, worker_pid: int) -> None:
    record_launch(handle, job_id=job_id, host=HOST, session=session)
    assert start_launch(handle, worker_pid=worker_pid, session=session)
    session.commit()


def _states(session) -> dict[str, str]:
    session.expire_all()
    return dict(session.execute(select(QuotaLaunch.handle, QuotaLaunch.state)).all())


def test_a_launch_whose_pool_process_died_is_ended_only_once_nothing_of_it_lives(db, launcher):
    guard = launcher.start(2, lambda: time.sleep(600) or 0, {})
    _started(db, "pool-died-nothing-left", job_id=1, worker_pid=_dead_pid())
    _started(db, "pool-died-launch-runs-on", job_id=2, worker_pid=_dead_pid())
    _started(db, "pool-alive", job_id=3, worker_pid=os.getpid())

    _beat(HOST, launcher)
    assert _states(db) == {
        "pool-died-nothing-left": "ended",
        "pool-died-launch-runs-on": "started",  # its GPUs stay taken: its guard and task still run
        "pool-alive": "started",
    }

    launcher.kill_job(2, guard)
    deadline = time.monotonic() + 30
    while launcher.running(2):
        assert time.monotonic() < deadline, "the killed launch never went"
        launcher.reap()
        time.sleep(0.05)
    _beat(HOST, launcher)
    assert _states(db)["pool-died-launch-runs-on"] == "ended"


def test_a_lost_host_ends_its_evicted_launches_before_its_gpus_return(db, launcher):
    launcher.start(1, lambda: time.sleep(600) or 0, {})
    db.get(QuotaHost, HOST).heartbeat_at = 0.0
    assert [h.name for h in mark_lost_hosts(30.0, now=100.0, session=db)] == [HOST]
    db.commit()
    assert launcher.running(1)

    _beat(HOST, launcher)
    assert not launcher.running(1), "the evicted launch was ended"
    db.expire_all()
    assert db.get(QuotaHost, HOST).state == HostState.ACTIVE.value


def test_a_lost_host_whose_evicted_launch_outlives_sigkill_stays_lost(db, tmp_path, monkeypatch):
    """Its GPUs stay out of the pool, and the next heartbeat tries again (the heartbeat thread logs
    the error) after ``[quota] leftover_wait_s``."""
    monkeypatch.setenv("AIRFLOW__QUOTA__LEFTOVER_WAIT_S", str(WAIT_S))
    with held_launch(tmp_path / "host", JOB):
        db.get(QuotaHost, HOST).heartbeat_at = 0.0
        assert [h.name for h in mark_lost_hosts(30.0, now=100.0, session=db)] == [HOST]
        db.commit()
        with pytest.raises(TimeoutError, match=re.escape(f"launches {JOB} still run")):
            _beat(HOST, LocalLauncher(tmp_path / "host", cgroups=False))
    db.expire_all()
    assert db.get(QuotaHost, HOST).state == HostState.LOST.value


@pytest.mark.parametrize("name", ["gpu-a\nforged log line", "gpu-a\x1b[31m", "../etc", "gpu a", "", ".gpu", "gpu\u202e"])
def test_a_host_name_that_is_not_a_dns_name_is_refused_before_the_worker_starts(name):
    """A host's name becomes a Celery queue, a folder and words in logs and the UI."""
    result = subprocess.run(
        ["airflow", "quota", "worker", "--queues", "gpu-fleet", "--virtual-gpus", "1", "--hostname", name],
        capture_output=True, text=True, timeout=120, env={**os.environ, "AIRFLOW__QUOTA__QUOTA_FILE": ""},
    )
    assert result.returncode == 1 and "--hostname:" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_worker_whose_leftover_launch_outlives_sigkill_exits_2_before_it_hands_out_its_gpus(tmp_path):
    """A host registers (hands out its GPUs) only once none of its recorded launches lives: one that
    SIGKILL does not end within the worker's wait (``[quota] leftover_wait_s``) stops the worker with
    exit code 2, naming the job."""
    with held_launch(tmp_path / f"host-{HOST}", JOB):
        result = subprocess.run(
            ["airflow", "quota", "worker", "--queues", "gpu-fleet", "--virtual-gpus", "1", "--hostname", HOST],
            capture_output=True, text=True, timeout=WAIT_S + 120,
            env={**os.environ, "AIRFLOW__QUOTA__QUOTA_FILE": "", "AIRFLOW__QUOTA__STATE_DIR": str(tmp_path),
                 "AIRFLOW__QUOTA__LEFTOVER_WAIT_S": str(WAIT_S)},
        )
    expected = (
        f"Error: host {HOST}: launches {JOB} still run {WAIT_S:g} s after SIGKILL; "
        "its GPUs are not handed out"
    )
    assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr, result.stderr


# ------------------------------------------------------------------------------------ GPU types

TYPED = """
queues:
  - name: fleet
    capacity: {h100: 8, a100: 8}
    quotas:
      - {name: team-a, capacity: {h100: 8, a100: 8}}
  - name: plain
    capacity: 4
    quotas:
      - {name: team-b, capacity: 4}
"""
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    """A fake ``nvidia-smi`` first on PATH that prints the lines given (the machine's edge: the real
    one's ``--query-gpu=index,name --format=csv,noheader`` output)."""

    def install(*gpus: str) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        script = bin_dir / "nvidia-smi"
        lines = "".join(f"{i}, {model}\n" for i, model in enumerate(gpus))
        script.write_text(f'#!/bin/sh\n[ "$1 $2" = "--query-gpu=index,name --format=csv,noheader" ] || exit 9\nprintf "{lines}"\n')
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    return install


@pytest.mark.parametrize(
    ("model", "gpu_type"),
    [
        (H100, "h100"), (A100, "a100"), ("NVIDIA L4", "l4"), ("Tesla T4", "t4"), ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA A10G", "a10g"), ("NVIDIA RTX A6000", "rtx-a6000"), ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ],
)
def test_a_gpu_model_is_named_by_its_type_without_vendor_memory_or_form_factor(model, gpu_type):
    from airflow_quota_provider.executors.config import gpu_type_of_model

    assert gpu_type_of_model(model) == gpu_type


def test_nvidia_smi_gives_the_indexes_and_their_models(nvidia_smi):
    from airflow_quota_provider.executors.config import discover_devices, nvidia_smi_gpus

    nvidia_smi(H100, H100, A100)
    assert nvidia_smi_gpus() == {"0": H100, "1": H100, "2": A100}
    assert discover_devices("", 8) == (["0", "1", "2"], "nvidia-smi")


def _gpu_type(queue: str, given: str | None = None, devices: str = "", virtual: int = 2):
    from airflow_quota_provider.cli.worker_command import _gpu_type
    from airflow_quota_provider.executors.config import discover_devices
    import yaml

    from airflow_quota_provider.policy import parse_quota_file

    types = {q.name: tuple(t.name for t in q.types) for q in parse_quota_file(yaml.safe_load(TYPED)).queues}[queue]
    return _gpu_type(given, queue, types, *discover_devices(devices, virtual))


def test_a_host_takes_its_type_from_nvidia_smi(nvidia_smi):
    nvidia_smi(A100, A100)
    assert _gpu_type("fleet") == "a100"


def test_a_host_of_several_gpu_models_is_refused_naming_them_unless_devices_picks_one(nvidia_smi):
    nvidia_smi(H100, A100, H100)
    with pytest.raises(SystemExit, match=re.escape(f"2 types, h100 (0: {H100}, 2: {H100}); a100 (1: {A100})")):
        _gpu_type("fleet")
    assert _gpu_type("fleet", devices="0,2") == "h100"
    assert _gpu_type("plain") is None, "an untyped job queue is served untyped"


def test_a_host_whose_type_the_job_queue_lacks_is_refused_naming_the_queues_types(nvidia_smi):
    nvidia_smi("NVIDIA L4")
    with pytest.raises(SystemExit, match=re.escape("GPUs are l4 (NVIDIA L4, by nvidia-smi), not one of job queue fleet's GPU types h100, a100")):
        _gpu_type("fleet")
    assert _gpu_type("fleet", given="a100") == "a100", "--gpu-type names them as the quota file does"


@pytest.mark.parametrize(
    ("queue", "given", "message"),
    [
        pytest.param("fleet", None, "--gpu-type is required: job queue fleet has GPU types h100, a100", id="virtual GPUs untyped"),
        pytest.param("fleet", "l4", "--gpu-type: 'l4' is not one of job queue fleet's GPU types h100, a100", id="not a type of the queue"),
        pytest.param("plain", "h100", "--gpu-type: job queue plain has no GPU types", id="an untyped queue"),
        pytest.param("fleet", "h100 sxm", "--gpu-type: 'h100 sxm' is not a GPU type name", id="not a name"),
    ],
)
def test_gpu_type_with_virtual_gpus_is_checked_against_the_job_queue(queue, given, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        _gpu_type(queue, given)


def test_virtual_gpus_of_a_type_of_the_job_queue_register_with_it():
    assert _gpu_type("fleet", "a100") == "a100"
    assert _gpu_type("plain") is None


def test_a_host_of_unknown_type_with_no_quota_file_to_check_says_it_counts_for_no_type_of_a_typed_queue(caplog):
    from airflow_quota_provider.cli.worker_command import _gpu_type
    from airflow_quota_provider.executors.config import discover_devices

    assert _gpu_type(None, "fleet", None, *discover_devices("", 2)) is None
    assert "virtual GPUs have none) and there is no quota file here ([quota] quota_file) to check job queue fleet" in caplog.text
    assert "this host's GPUs count for none of them and no job starts here; pass --gpu-type" in caplog.text


def test_the_worker_refuses_a_host_of_several_gpu_models_before_it_registers(nvidia_smi, tmp_path):
    nvidia_smi(H100, A100)
    (tmp_path / "quotas.yaml").write_text(TYPED)
    result = subprocess.run(
        ["airflow", "quota", "worker", "--queues", "fleet", "--hostname", HOST],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "AIRFLOW__QUOTA__QUOTA_FILE": str(tmp_path / "quotas.yaml"), "AIRFLOW__QUOTA__STATE_DIR": str(tmp_path)},
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"this host's GPUs are of 2 types, h100 (0: {H100}); a100 (1: {A100})" in result.stderr
