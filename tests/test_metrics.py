"""emit_metrics through Airflow's Stats to a real StatsD client, received by a local UDP listener."""

from __future__ import annotations

import secrets
import socket

import pytest
import yaml
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from airflow.sdk.observability import stats
from airflow_quota_provider.metrics import GpuSecondsMeter, emit_metrics
from airflow_quota_provider.models.meter import EVENTS, QuotaMeter, position
from airflow_quota_provider.models.base import quota_metadata
from airflow_quota_provider.models.job import EventKind, QuotaEvent, QuotaJob, record_event
from airflow_quota_provider.policy import parse_quota_file
from tests.plugins.seed import seed_into
from tests.quota_api_support import BASELINE, QUOTAS

STATSD_PORT = 18250


@pytest.fixture
def statsd(monkeypatch):
    """A UDP listener, and Airflow's Stats sending StatsD to it (as ``[metrics] statsd_on`` does)."""
    from airflow._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.observability.metrics.stats_utils import get_stats_factory

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", STATSD_PORT))
    sock.settimeout(0.5)
    for key, value in {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(STATSD_PORT),
                       "STATSD_PREFIX": "airflow"}.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
    stats.initialize(factory=get_stats_factory(), export_legacy_names=False)

    def received() -> list[str]:
        lines = []
        while True:
            try:
                lines.extend(sock.recv(65535).decode().splitlines())
            except TimeoutError:
                return lines

    try:
        yield received
    finally:
        stats.initialize(factory=NoStatsLogger, export_legacy_names=False)
        sock.close()


@pytest.fixture
def session(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'quota.db'}")
    quota_metadata.create_all(engine)
    with Session(engine) as session:
        yield session


@pytest.fixture
def quota_file():
    return parse_quota_file(yaml.safe_load(QUOTAS))


def test_gauges_per_quota_reach_statsd_and_history_is_not_counted(statsd, session, quota_file):
    seed_into(list(BASELINE), session=session)

    emit_metrics(quota_file, session=session)

    lines = statsd()
    for line in (
        "airflow.quota.gpus_in_use.team-a:2|g",
        "airflow.quota.gpus_in_use.team-b:5|g",
        "airflow.quota.borrowed.team-b:1|g",
        "airflow.quota.lent.team-a:1|g",
        "airflow.quota.free.team-a:1|g",
        "airflow.quota.pending_jobs.team-a:2|g",
        "airflow.quota.pending_gpus.team-a:3|g",
        "airflow.quota.gpus_in_use.team-lab:0|g",
    ):
        assert line in lines
    assert not [x for x in lines if x.startswith("airflow.quota.admissions.")]  # seeded admissions are history
    assert position(EVENTS, session=session) == session.scalar(select(func.max(QuotaEvent.id))) > 0


def test_events_since_the_cursor_become_counters_and_a_wait_timer_once(statsd, session, quota_file):
    ids = seed_into([{"case": "metrics_waiter", "quota": "team-a", "gpus": 1, "waited_s": 30.0}], session=session)
    emit_metrics(quota_file, session=session)
    statsd()

    waiter = session.get(QuotaJob, ids["metrics_waiter"])
    record_event(EventKind.ADMITTED, job=waiter, session=session, devices="7")
    fields = dict(victim="41", preemptor=waiter.job_id, reason="reclaim", quota="team-b")
    record_event(EventKind.PREEMPTED, session=session, **fields)
    record_event(EventKind.PREEMPTION_LIMIT_REACHED, session=session, message="past max_preemptions 0", **fields)
    session.flush()

    emit_metrics(quota_file, session=session)
    lines = statsd()
    assert "airflow.quota.admissions.team-a:1|c" in lines
    assert "airflow.quota.preemptions.team-b.reclaim:1|c" in lines
    assert "airflow.quota.preemption_limit_failures.team-b:1|c" in lines
    (timer,) = [x for x in lines if x.startswith("airflow.quota.wait_time.team-a:")]
    waited_ms = float(timer.split(":")[1].split("|")[0])
    assert timer.endswith("|ms") and 30_000 <= waited_ms < 30_000 + 60_000

    emit_metrics(quota_file, session=session)
    again = statsd()
    assert not [x for x in again if "|c" in x or "|ms" in x]
    assert "airflow.quota.pending_jobs.team-a:1|g" in again  # gauges every call


def test_a_failure_is_logged_not_raised(statsd, quota_file, tmp_path):
    broken = Session(create_engine(f"sqlite:///{tmp_path / 'empty.db'}"))  # no quota tables
    emit_metrics(quota_file, session=broken)
    GpuSecondsMeter(every_s=0).emit(quota_file, session=broken, now=1.0)
    broken.close()
    assert statsd() == []


def test_each_cohort_gets_gauges_of_its_subtree(statsd, session):
    data = yaml.safe_load(QUOTAS)
    fleet = data["queues"][0]
    fleet["cohorts"] = [{"name": "ml"}]
    for quota in fleet["quotas"]:
        quota["cohort"] = "ml"
    seed_into(list(BASELINE), session=session)

    emit_metrics(parse_quota_file(data), session=session)

    lines = statsd()
    for line in ("airflow.quota.cohort.gpus_in_use.ml:7|g", "airflow.quota.cohort.borrowed.ml:0|g",
                 "airflow.quota.cohort.lent.ml:0|g", "airflow.quota.gpus_in_use.team-a:2|g"):
        assert line in lines


def _counts(lines: list[str], metric: str) -> dict[str, int]:
    """``airflow.quota.<metric>.<quota>.<kind>:N|c`` lines summed per ``<quota>.<kind>``."""
    prefix = f"airflow.quota.{metric}."
    out: dict[str, int] = {}
    for line in lines:
        if line.startswith(prefix) and line.endswith("|c"):
            name, value = line[len(prefix):-2].split(":")
            out[name] = out.get(name, 0) + int(value)
    return out


def test_gpu_seconds_per_quota_and_kind_add_up_to_the_usage_report(statsd, session, quota_file):
    """team-b borrows 1 GPU of team-a's; a team-a job is preempted after 40 s without a checkpoint.
    The first window ends a quarter into a second: the fractions carried over make whole seconds."""
    from airflow_quota_provider.usage_report import usage_report

    t0 = 1_000_000.0
    borrower = QuotaJob(dag_id="d", run_id="r", task_id="borrower", quota="team-b", gpus=5, priority=0,
                        state="running", submitted_at=t0)
    victim = QuotaJob(dag_id="d", run_id="r", task_id="victim", quota="team-a", gpus=1, priority=0,
                      state="pending", submitted_at=t0)
    session.add_all([borrower, victim])
    session.flush()
    for job, kind, at in ((borrower, "admitted", t0 + 10), (victim, "admitted", t0 + 20), (victim, "preempted", t0 + 50),
                          (victim, "released", t0 + 60), (victim, "stopped", t0 + 60)):
        devices = ",".join(str(i) for i in range(job.gpus)) if kind in ("admitted", "released") else None
        session.add(QuotaEvent(at=at, kind=kind, job_id=job.id, dag_id=job.dag_id, quota=job.quota, devices=devices))
    session.flush()

    meter = GpuSecondsMeter(every_s=0)
    meter.emit(quota_file, session=session, now=t0)
    assert _counts(statsd(), "gpu_seconds") == {}  # the first call starts the clock
    meter.emit(quota_file, session=session, now=t0 + 100.25)
    first = _counts(statsd(), "gpu_seconds")
    meter.emit(quota_file, session=session, now=t0 + 101)
    second = _counts(statsd(), "gpu_seconds")

    assert first["team-b.used_within"] == 4 * 90.25 and first["team-b.borrowed"] == 90  # 90.25 s, floored
    assert first["team-a.lost"] == 40 and "team-a.lost" not in second
    report = {row["quota"]: row for row in usage_report(quota_file, t0, t0 + 101, session=session)}
    for quota, row in report.items():
        for kind in ("used_within", "borrowed", "lent", "idle", "lost"):
            sent = first.get(f"{quota}.{kind}", 0) + second.get(f"{quota}.{kind}", 0)
            assert 0 <= row[kind] - sent < 1, (quota, kind, sent, row[kind])
    assert second["team-b.borrowed"] == 1  # 0.25 carried + 0.75

    # At most every ``every_s``: a call sooner sends nothing, and the next one covers its span.
    session.query(QuotaMeter).delete()
    paced = GpuSecondsMeter(every_s=15)
    paced.emit(quota_file, session=session, now=t0)
    paced.emit(quota_file, session=session, now=t0 + 10)
    assert _counts(statsd(), "gpu_seconds") == {}
    paced.emit(quota_file, session=session, now=t0 + 20)
    assert _counts(statsd(), "gpu_seconds")["team-b.used_within"] == 4 * 10  # admitted at t0 + 10


def test_two_schedulers_count_each_gpu_second_once(statsd, session, quota_file):
    """Each scheduler has a meter; the span counted is shared, so the second one's call at the same
    moment sends nothing (each used to count [t0, t0 + 100) itself)."""
    t0 = 1_000_000.0
    job = QuotaJob(dag_id="d", run_id="r", task_id="t", quota="team-a", gpus=2, priority=0, state="running",
                   submitted_at=t0)
    session.add(job)
    session.flush()
    session.add(QuotaEvent(at=t0, kind="admitted", job_id=job.id, dag_id="d", quota="team-a", devices="0,1"))
    one, other = GpuSecondsMeter(every_s=0), GpuSecondsMeter(every_s=0)
    one.emit(quota_file, session=session, now=t0)
    other.emit(quota_file, session=session, now=t0)
    one.emit(quota_file, session=session, now=t0 + 100)
    other.emit(quota_file, session=session, now=t0 + 100)
    other.emit(quota_file, session=session, now=t0 + 150)
    assert _counts(statsd(), "gpu_seconds")["team-a.used_within"] == 2 * 150


@pytest.fixture
def postgres():
    from tests.fleet_support import _admin

    database = f"quota_metrics_{secrets.token_hex(4)}"
    _admin(f"CREATE DATABASE {database}")
    engine = create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}")
    quota_metadata.create_all(engine)
    yield engine
    engine.dispose()
    _admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def test_a_scheduler_counting_events_makes_the_other_skip_them_on_postgresql(statsd, postgres, quota_file):
    """Two schedulers' cycles at once on real PostgreSQL: the one that takes the metrics lock counts
    the admission; the other sends no counter, then or after the first commits."""
    with Session(postgres) as setup:
        emit_metrics(quota_file, session=setup)  # the first count ever: history skipped
        job = QuotaJob(dag_id="d", run_id="r", task_id="t", quota="team-a", gpus=1, priority=0, state="running",
                       submitted_at=0.0)
        setup.add(job)
        setup.flush()
        record_event(EventKind.ADMITTED, job=job, session=setup, devices="0")
        setup.commit()
    statsd()
    with Session(postgres) as one, Session(postgres) as other:
        emit_metrics(quota_file, session=one)
        emit_metrics(quota_file, session=other)  # the lock is taken: skipped
        one.commit()
        emit_metrics(quota_file, session=other)  # the cursor has moved past the admission
        other.commit()
    assert [x for x in statsd() if x.startswith("airflow.quota.admissions.")] == ["airflow.quota.admissions.team-a:1|c"]


def test_a_typed_quota_gets_its_gauges_per_gpu_type_named_and_tagged_with_it(statsd, session, monkeypatch):
    from airflow.observability.metrics.stats_utils import get_stats_factory

    from tests.test_usage import TYPED_JOBS, TYPED_QUOTAS

    seed_into(list(TYPED_JOBS), session=session)
    typed = parse_quota_file(yaml.safe_load(TYPED_QUOTAS))

    emit_metrics(typed, session=session)
    lines = statsd()
    for line in (
        "airflow.quota.gpus_in_use.team-a:3|g",  # over all its types, as before
        "airflow.quota.borrowed.team-a:0|g",
        "airflow.quota.gpus_in_use.team-a.h100:3|g",
        "airflow.quota.borrowed.team-a.h100:1|g",  # above its 2 h100s, within its 6 GPUs
        "airflow.quota.lent.team-b.h100:1|g",
        "airflow.quota.free.team-b.a100:6|g",
        "airflow.quota.pending_gpus.team-b:2|g",
        "airflow.quota.gpus_in_use.team-lab:1|g",
    ):
        assert line in lines
    assert not [x for x in lines if x.startswith(("airflow.quota.pending_jobs.team-b.", "airflow.quota.free.team-lab."))]

    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED", "True")  # tags in the name: quota.x,tag=value
    stats.initialize(factory=get_stats_factory(), export_legacy_names=False)
    emit_metrics(typed, session=session)
    tagged = statsd()
    assert "airflow.quota.borrowed.team-a.h100,quota=team-a,queue=mixed,gpu_type=h100:1|g" in tagged
    assert "airflow.quota.gpus_in_use.team-lab,quota=team-lab,queue=lab:1|g" in tagged


def test_a_typed_cohort_gets_its_gauges_per_gpu_type(statsd, session):
    from tests.test_usage import TYPED_JOBS, TYPED_QUOTAS

    data = yaml.safe_load(TYPED_QUOTAS)
    data["queues"][0]["cohorts"] = [{"name": "ml"}]
    data["queues"][0]["quotas"][0]["cohort"] = "ml"  # team-a
    seed_into(list(TYPED_JOBS), session=session)

    emit_metrics(parse_quota_file(data), session=session)

    lines = statsd()
    for line in ("airflow.quota.cohort.gpus_in_use.ml:3|g", "airflow.quota.cohort.borrowed.ml:0|g",
                 "airflow.quota.cohort.gpus_in_use.ml.h100:3|g", "airflow.quota.cohort.borrowed.ml.h100:1|g",
                 "airflow.quota.cohort.lent.ml.a100:0|g", "airflow.quota.borrowed.team-a.h100:1|g"):
        assert line in lines
