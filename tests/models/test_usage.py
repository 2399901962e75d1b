"""The daily roll-up and db-clean: pruning the audit log keeps every usage total unchanged."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from airflow_quota_provider.models.job import JobState, QuotaEvent, QuotaJob
from airflow_quota_provider.policy import Queue, Quota, QuotaFile
from airflow_quota_provider.policy.accounting import DAY_S
from airflow_quota_provider.usage_report import UsageRequestError, db_clean, usage_report, usage_series

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
    session.add(QuotaEvent(at=DAY0 + 10, kind="config_loaded", message="quotas.yaml"))
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
    # Only the running job's events are left from before the horizon.
    assert session.scalar(select(func.count()).select_from(QuotaEvent)) == 1
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


def test_a_bound_inside_a_rolled_up_day_is_refused_naming_it(history):
    db_clean(QUOTAS, 1, session=history, now=DAY0 + 3 * DAY_S + 600)
    with pytest.raises(UsageRequestError, match="^since: .* falls in a day already rolled up"):
        usage_report(QUOTAS, DAY0 + 3600, DAY0 + 3 * DAY_S, session=history)


@pytest.mark.parametrize(
    ("by", "since", "until", "field"),
    [
        pytest.param("team", DAY0, DAY0 + 1, "by", id="by names one of quota, dag, owner"),
        pytest.param("quota", DAY0, DAY0, "until", id="until must be after since"),
    ],
)
def test_bad_requests_name_the_field(session, by, since, until, field):
    with pytest.raises(UsageRequestError, match=f"^{field}: "):
        usage_report(QUOTAS, since, until, by=by, session=session)
