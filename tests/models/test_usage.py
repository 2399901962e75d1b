"""The daily roll-up and db-clean: pruning the audit log keeps every usage total unchanged."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from airflow_quota_provider.models.job import JobState, QuotaEvent, QuotaJob, record_config_loaded
from airflow_quota_provider.policy import Queue, Quota, QuotaFile
from airflow_quota_provider.policy.accounting import DAY_S
from airflow_quota_provider.usage_report import (
    MAX_DAYS,
    UsageRequestError,
    csv_cell,
    db_clean,
    parse_time,
    usage_csv,
    usage_report,
    usage_series,
)

QUOTAS = QuotaFile((Queue("fleet", 10, (Quota("team-a", 4), Quota("team-b", 4))),))
DAY0 = 100 * DAY_S


def _job(session, name: str, quota: str, state: JobState, finished_at: float | None = None) -> QuotaJob:
    job = QuotaJob(dag_id=f"dag-{name}", run_id="run", task_id=name, quota=quota, gpus=1, priority=0,
                   state=state.value, submitted_at=DAY0, finished_at=finished_at)
    session.add(job)
    session.flush()
    return job


def _events(session, job: QuotaJob, *kinds_at: tuple[str, float], devices: str = "0") -> None:
    for kind, at in kinds_at:
        session.add(QuotaEvent(at=at, kind=kind, job_id=job.id, dag_id=job.dag_id, quota=job.quota,
                               devices=devices if kind in ("admitted", "released") else None))
    session.flush()


@pytest.fixture
def history(session):
    """Three days: a borrower across the first midnight, a preempted victim, a job still running."""
    borrower = _job(session, "borrower-across-midnight", "team-a", JobState.FINISHED, DAY0 + DAY_S + 3600)
    _events(session, borrower, ("admitted", DAY0 + 80000), ("released", DAY0 + DAY_S + 3600),
            ("finished", DAY0 + DAY_S + 3600), devices="0,1,2,3,4,5,6,7")
    victim = _job(session, "victim-preempted-once", "team-b", JobState.FINISHED, DAY0 + 5000)
    _events(session, victim, ("admitted", DAY0 + 1000), ("preempted", DAY0 + 1900), ("released", DAY0 + 2000),
            ("stopped", DAY0 + 2000), ("admitted", DAY0 + 3000), ("released", DAY0 + 5000),
            ("finished", DAY0 + 5000), devices="0,1")
    running = _job(session, "still-running", "team-b", JobState.RUNNING)
    _events(session, running, ("admitted", DAY0 + 40000))
    # Installed at DAY0, before the executor recorded its quotas on config_loaded: today's file applies.
    session.add(QuotaEvent(at=DAY0, kind="config_loaded", message="quotas.yaml"))
    session.flush()
    return session


def _all(session, since=DAY0, until=DAY0 + 3 * DAY_S):
    owners = {"dag-borrower-across-midnight": "ml", "dag-victim-preempted-once": "ml"}
    return {by: usage_report(QUOTAS, since, until, by=by, session=session, owners=owners)
            for by in ("quota", "dag", "owner")}


def test_roll_up_and_clean_keep_every_total_unchanged(history):
    session = history
    before = _all(session)
    day_two = _all(session, DAY0 + DAY_S, DAY0 + 2 * DAY_S)
    result = db_clean(QUOTAS, 1, session=session, now=DAY0 + 3 * DAY_S + 600)
    assert (result["days_rolled_up"], result["jobs_deleted"]) == (2, 2)
    # Only the running job's event and the configuration in force are left from before the horizon.
    left = session.scalars(select(QuotaEvent.kind).order_by(QuotaEvent.id)).all()
    assert left == ["admitted", "config_loaded"]
    assert _all(session) == before
    assert _all(session, DAY0 + DAY_S, DAY0 + 2 * DAY_S) == day_two
    # Cleaning again rolls up nothing more and changes nothing.
    assert db_clean(QUOTAS, 1, session=session, now=DAY0 + 3 * DAY_S + 900)["days_rolled_up"] == 0
    assert _all(session) == before


def test_the_report_charges_the_scripted_history(history):
    quota = {row["quota"]: row for row in _all(history)["quota"]}
    # team-a: 8 GPUs from 80000 s into day 0 to 3600 s into day 1: 4 within, 4 borrowed.
    held = (DAY_S - 80000) + 3600
    assert (quota["team-a"]["used_within"], quota["team-a"]["borrowed"]) == (4 * held, 4 * held)
    # team-b: the victim lost its 900 s + 100 s grace on 2 GPUs (no checkpoint).
    assert quota["team-b"]["lost"] == 2 * 1000
    assert quota["team-b"]["used_within"] + quota["team-b"]["lent"] + quota["team-b"]["idle"] == 4 * 3 * DAY_S


def test_adjacent_periods_add_up_when_a_preemption_ends_a_hold_after_their_boundary(history):
    """The victim's first hold (1000-2000 s, preempted at 1900 s) is cut at 1950 s: the period before
    the cut learns from the later events that its 950 s on 2 GPUs were lost too."""
    cut = DAY0 + 1950
    whole, before, after = ({r["quota"]: r for r in _all(history, since, until)["quota"]}
                            for since, until in ((DAY0, DAY0 + DAY_S), (DAY0, cut), (cut, DAY0 + DAY_S)))
    assert (before["team-b"]["lost"], after["team-b"]["lost"]) == (2 * 950, 2 * 50)
    for kind in ("capacity_s", "used_within", "borrowed", "lent", "idle", "lost"):
        assert before["team-b"][kind] + after["team-b"][kind] == whole["team-b"][kind], kind


def _summed(series) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for bucket in series:
        for row in bucket["rows"]:
            sums = out.setdefault(row["quota"], {})
            for kind in ("capacity_s", "used_within", "borrowed", "lent", "idle", "lost"):
                sums[kind] = sums.get(kind, 0.0) + row[kind]
    return out


def test_a_series_cuts_the_report_into_buckets_that_add_up_to_it_before_and_after_a_clean(history):
    """6-hour buckets from the events; after db-clean, the rolled-up days are whole-day buckets."""
    report = {row["quota"]: row for row in _all(history)["quota"]}
    series = usage_series(QUOTAS, DAY0, DAY0 + 3 * DAY_S, 6 * 3600, session=history)
    assert [b["since"] for b in series[:2]] == ["1970-04-11T00:00:00Z", "1970-04-11T06:00:00Z"] and len(series) == 12
    # The borrower holds 8 GPUs from 80000 s into day 0: its first bucket has 86400 - 80000 s of it.
    last_of_day0 = {row["quota"]: row for row in series[3]["rows"]}
    assert last_of_day0["team-a"]["used_within"] == 4 * (DAY_S - 80000)

    db_clean(QUOTAS, 1, session=history, now=DAY0 + 3 * DAY_S + 600)
    cleaned = usage_series(QUOTAS, DAY0, DAY0 + 3 * DAY_S, 6 * 3600, session=history)
    assert len(cleaned) == 2 + 4  # two rolled-up days, then day 2 in quarters
    for buckets in (series, cleaned):
        for quota, sums in _summed(buckets).items():
            for kind, total in sums.items():
                assert total == pytest.approx(report[quota][kind], abs=0.01), (quota, kind)


@pytest.mark.parametrize("every_s", [7 * 60, 30, 2 * DAY_S], ids=["not a divisor of a day", "under a minute", "over a day"])
def test_a_series_bucket_that_would_not_cut_at_midnight_is_refused(session, every_s):
    with pytest.raises(UsageRequestError, match="^every: "):
        usage_series(QUOTAS, DAY0, DAY0 + DAY_S, every_s, session=session)


def test_a_report_from_the_epoch_starts_at_the_install_and_one_before_it_is_empty(history):
    """``since=0`` asks for everything: the report and its hourly series start at the install's
    start (DAY0, 100 days after the epoch: 2,424 hourly buckets from the epoch, 24 from DAY0)."""
    from_epoch = usage_report(QUOTAS, 0, DAY0 + DAY_S, session=history)
    assert from_epoch == usage_report(QUOTAS, DAY0, DAY0 + DAY_S, session=history)
    assert {row["since"] for row in from_epoch} == {"1970-04-11T00:00:00Z"}
    series = usage_series(QUOTAS, 0, DAY0 + DAY_S, 3600, session=history)
    assert (len(series), series[0]["since"]) == (24, "1970-04-11T00:00:00Z")
    assert usage_report(QUOTAS, 0, DAY0, session=history) == []
    assert usage_series(QUOTAS, 0, DAY0, 3600, session=history) == []


def test_a_bound_inside_a_rolled_up_day_is_refused_naming_it(history):
    db_clean(QUOTAS, 1, session=history, now=DAY0 + 3 * DAY_S + 600)
    with pytest.raises(UsageRequestError, match="^since: .* falls in a day already rolled up"):
        usage_report(QUOTAS, DAY0 + 3600, DAY0 + 3 * DAY_S, session=history)


@pytest.mark.parametrize(
    ("by", "since", "until", "field"),
    [
        pytest.param("team", DAY0, DAY0 + 1, "by", id="by names one of quota, dag, owner"),
        pytest.param("quota", DAY0, DAY0, "until", id="until must be after since"),
        pytest.param("quota", DAY0 + 1, DAY0, "until", id="until before since"),
        pytest.param("quota", 0, DAY0 + (MAX_DAYS + 1) * DAY_S, "until", id="over MAX_DAYS days from the install"),
    ],
)
def test_bad_requests_name_the_field(history, by, since, until, field):
    with pytest.raises(UsageRequestError, match=f"^{field}: "):
        usage_report(QUOTAS, since, until, by=by, session=history)


# ---------------------------------------------------------------------------------- history

GROWN = QuotaFile((Queue("fleet", 10, (Quota("team-a", 8), Quota("team-b", 2))),))
NOW = DAY0 + 5 * DAY_S


def _loaded(session, quota_file: QuotaFile, at: float) -> None:
    record_config_loaded(quota_file, "quotas.yaml", session=session).at = at
    session.flush()


def _quota_rows(session, since, until, quota_file=QUOTAS):
    return {row["quota"]: row for row in usage_report(quota_file, since, until, session=session)}


def test_a_fresh_install_reports_idle_hours_only_since_its_quotas_were_loaded(session):
    """The scheduler started 3 minutes ago: a report from the epoch charges those 3 minutes."""
    _loaded(session, QUOTAS, NOW - 180)
    rows = _quota_rows(session, 0, NOW)
    assert (rows["team-a"]["capacity_s"], rows["team-a"]["idle"]) == (4 * 180, 4 * 180)


def test_an_install_older_than_its_config_events_is_charged_from_its_first_event(history):
    rows = _quota_rows(history, 0, DAY0 + DAY_S)
    assert rows["team-b"]["capacity_s"] == 4 * DAY_S  # from DAY0, not from the epoch


def test_each_part_is_charged_with_the_quota_file_in_force_then_and_db_clean_keeps_it(session):
    """team-a's capacity went from 4 to 8 GPUs mid-day 1 while a job held 6 of its GPUs; the file read
    now (GROWN) does not rewrite the past, before db-clean or after it."""
    _loaded(session, QUOTAS, DAY0)
    _loaded(session, GROWN, DAY0 + 1.5 * DAY_S)
    job = _job(session, "six-gpus-across-the-change", "team-a", JobState.FINISHED, DAY0 + 2 * DAY_S)
    _events(session, job, ("admitted", DAY0 + DAY_S), ("released", DAY0 + 2 * DAY_S), ("finished", DAY0 + 2 * DAY_S),
            devices="0,1,2,3,4,5")
    half = DAY_S / 2
    want = {"capacity_s": 4 * half + 8 * half, "used_within": 4 * half + 6 * half, "borrowed": 2 * half,
            "idle": 8 * half - 6 * half, "lent": 0, "lost": 0}
    day1 = _quota_rows(session, DAY0 + DAY_S, DAY0 + 2 * DAY_S, GROWN)["team-a"]
    assert {k: day1[k] for k in want} == want
    three_days = _quota_rows(session, DAY0, DAY0 + 3 * DAY_S, GROWN)
    db_clean(GROWN, 1, session=session, now=DAY0 + 3 * DAY_S + 600)
    day1 = _quota_rows(session, DAY0 + DAY_S, DAY0 + 2 * DAY_S, GROWN)["team-a"]
    assert {k: day1[k] for k in want} == want
    assert _quota_rows(session, DAY0, DAY0 + 3 * DAY_S, GROWN) == three_days
    # Day 2 (not rolled up) is still charged with GROWN, the file in force since mid-day 1.
    assert three_days["team-a"]["capacity_s"] == 4 * DAY_S + 4 * half + 8 * half + 8 * DAY_S


# ---------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "value",
    ["nan", "NaN", "inf", "-inf", "infinity", "1e20", "-1", "253402300800", "0001-01-01T00:00:00+05:00",
     "9999-12-31T23:59:59-05:00"],
)
def test_times_outside_1970_to_9999_are_refused_naming_the_field_and_range(value):
    with pytest.raises(UsageRequestError, match=r"^until: .* is not a time from 1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z"):
        parse_time(value, "until")


@pytest.mark.parametrize("value", ["yesterday", "2026-13-01", "", "1e"])
def test_a_time_that_is_neither_iso_nor_seconds_is_refused_naming_the_field(value):
    with pytest.raises(UsageRequestError, match=r"^since: .* is not an ISO 8601 time"):
        parse_time(value, "since")


@pytest.mark.parametrize("days", [float("nan"), float("inf"), -1.0, 1e20])
def test_db_clean_refuses_an_older_than_that_is_not_a_number_of_days(session, days):
    with pytest.raises(UsageRequestError, match="^older-than: .* is not a number of days from 0 to 36500"):
        db_clean(QUOTAS, days, session=session, now=NOW)


@pytest.mark.parametrize(
    ("cell", "want"),
    [
        pytest.param("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")", id="equals"),
        pytest.param("+1", "'+1", id="plus"),
        pytest.param("-dag", "'-dag", id="minus"),
        pytest.param("@SUM(A1)", "'@SUM(A1)", id="at"),
        pytest.param("\tx", "'\tx", id="tab"),
        pytest.param("\rx", "'\rx", id="carriage return"),
        pytest.param("team=a", "team=a", id="only the first character counts"),
        pytest.param(-3.5, -3.5, id="a number stays a number"),
    ],
)
def test_csv_cells_that_a_spreadsheet_would_run_are_escaped(cell, want):
    assert csv_cell(cell) == want


def test_the_csv_escapes_an_owner_that_starts_like_a_formula(history):
    rows = usage_report(QUOTAS, DAY0, DAY0 + DAY_S, by="owner", session=history,
                        owners={"dag-borrower-across-midnight": "=cmd|' /C calc'!A0"})
    text = usage_csv(rows, "owner")
    assert "\n'=cmd|' /C calc'!A0," in text and "\n=cmd" not in text


# ---------------------------------------------------------------------------------- GPU types and prices

PRICED = """
  - name: mixed
    gpu_hour_price: {h100: 4.0, a100: 2.0}
  - name: lab
    gpu_hour_price: 0.5
"""


def _priced_typed_file() -> QuotaFile:
    """tests/test_usage.py's typed quota file, with a price per GPU-hour on each job queue."""
    import yaml

    from airflow_quota_provider.policy import parse_quota_file
    from tests.test_usage import TYPED_QUOTAS

    data = yaml.safe_load(TYPED_QUOTAS)
    for queue, priced in zip(data["queues"], yaml.safe_load(PRICED)):
        queue["gpu_hour_price"] = priced["gpu_hour_price"]
    return parse_quota_file(data)


def test_the_cli_and_the_api_charge_a_typed_queue_per_gpu_type_with_its_cost(session, monkeypatch, capsys):
    """Jobs admitted on a GPU type (their admitted events record it) are charged on that type's row;
    each row's cost is its used_within + borrowed GPU-hours at its type's price; CSV and REST agree."""
    import argparse
    import csv
    import io
    import json
    import time
    from contextlib import contextmanager

    from airflow_quota_provider.cli import quota_command
    from airflow_quota_provider.plugins import services
    from tests.plugins.seed import seed_into
    from tests.test_usage import TYPED_JOBS

    quota_file = _priced_typed_file()
    now = time.time()
    _loaded(session, quota_file, now - 600)  # the audit log keeps the typed file: the report charges with it
    seed_into(list(TYPED_JOBS), session=session)
    assert {e.gpu_type for e in session.scalars(select(QuotaEvent).where(QuotaEvent.kind == "admitted"))} == {"h100", "a100", None}

    @contextmanager
    def create_session():
        yield session

    monkeypatch.setattr(quota_command, "create_session", create_session)
    monkeypatch.setattr(quota_command, "_quota_file", lambda: quota_file)
    since, until = str(now - 600), str(now + 3600)
    usage = lambda **kw: quota_command.usage(argparse.Namespace(since=since, until=until, verbose=False, **kw))  # noqa: E731

    usage(by="quota", output="json")
    rows = {(r["quota"], r["gpu_type"]): r for r in json.loads(capsys.readouterr().out)}
    assert list(rows) == [("team-a", "a100"), ("team-a", "h100"), ("team-b", "a100"), ("team-b", "h100"), ("team-lab", None)]
    on_h100 = rows[("team-a", "h100")]  # 3 GPUs on its 2 H100s: one borrowed, though its A100s are idle
    assert on_h100["borrowed"] == pytest.approx(on_h100["used_within"] / 2) and on_h100["borrowed"] > 3500
    assert rows[("team-a", "a100")]["used_within"] == 0 and rows[("team-b", "h100")]["lent"] == pytest.approx(on_h100["borrowed"])
    for (quota, gpu_type), row in rows.items():
        price = {"h100": 4.0, "a100": 2.0, None: 0.5}[gpu_type]
        assert row["cost"] == pytest.approx((row["used_within"] + row["borrowed"]) / 3600 * price, abs=1e-3)
        assert row["used_within"] + row["lent"] + row["idle"] == pytest.approx(row["capacity_s"])

    usage(by="quota", output="csv")
    text = capsys.readouterr().out
    assert text.startswith("quota,gpu_type,capacity_s,used_within,borrowed,lent,idle,lost,cost,since,until\n")
    assert {(r["quota"], r["gpu_type"] or None): float(r["cost"]) for r in csv.DictReader(io.StringIO(text))} == {
        key: row["cost"] for key, row in rows.items()}
    api = services.usage(quota_file, since, until, "quota", session=session)
    assert {(r.key, r.gpu_type): r.cost for r in api.rows} == {key: row["cost"] for key, row in rows.items()}

    usage(by="dag", output="json")
    dags = {(r["dag"], r["gpu_type"]): r["cost"] for r in json.loads(capsys.readouterr().out)}
    assert set(dags) == {("quota_cases", "a100"), ("quota_cases", "h100"), ("quota_cases", None)}
    assert sum(dags.values()) == pytest.approx(sum(row["cost"] for row in rows.values()), abs=1e-3)
    usage(by="dag", output="table")
    assert capsys.readouterr().out.splitlines()[0].split() == ["dag", "gpu_type", "used_within", "borrowed", "lost", "cost"]


def test_an_untyped_unpriced_report_has_no_gpu_type_or_cost_column(history):
    rows = _all(history)
    assert all("gpu_type" not in row and "cost" not in row for by in rows.values() for row in by)
    assert usage_csv(rows["quota"], "quota").startswith("quota,capacity_s,used_within,borrowed,lent,idle,lost,since,until\n")


def test_roll_up_and_clean_keep_the_figures_per_gpu_type(session):
    """A day of a typed queue rolled up reads back per type, with the same costs."""
    quota_file = _priced_typed_file()
    _loaded(session, quota_file, DAY0)
    for name, quota, gpu_type, devices in (("a-h100", "team-a", "h100", "0,1,2"), ("b-a100", "team-b", "a100", "3,4"),
                                           ("lab", "team-lab", None, "5")):
        job = _job(session, name, quota, JobState.FINISHED, DAY0 + 7200)
        for kind, at in (("admitted", DAY0 + 3600), ("released", DAY0 + 7200), ("finished", DAY0 + 7200)):
            session.add(QuotaEvent(at=at, kind=kind, job_id=job.id, dag_id=job.dag_id, quota=quota, gpu_type=gpu_type,
                                   devices=devices if kind != "finished" else None))
    session.flush()
    reports = lambda: {by: usage_report(quota_file, DAY0, DAY0 + 2 * DAY_S, by=by, session=session)  # noqa: E731
                       for by in ("quota", "dag")}
    before = reports()
    h100 = next(r for r in before["quota"] if (r["quota"], r["gpu_type"]) == ("team-a", "h100"))
    assert (h100["used_within"], h100["borrowed"], h100["cost"]) == (2 * 3600, 3600, 12.0)
    assert db_clean(quota_file, 0, session=session, now=DAY0 + 2 * DAY_S)["days_rolled_up"] == 2
    assert reports() == before
