"""A GPU host records a launch's end even when the database is away for a while: an end never
recorded would hold the job's GPUs for ever (the pool process that ran it lives on)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from airflow_quota_provider.executors.celery_worker import _record


class DatabaseAway:
    """Writes through a real session that fail like a restarting database for the first ``times``."""

    def __init__(self, times: int) -> None:
        self.times, self.calls = times, 0

    def __call__(self, session) -> None:
        self.calls += 1
        session.execute(text("SELECT 1"))
        if self.calls <= self.times:
            raise OperationalError("UPDATE quota_launch ...", {}, Exception("server closed the connection unexpectedly"))


def test_a_launch_end_is_recorded_once_the_database_is_back():
    write = DatabaseAway(times=2)
    assert _record("quota-1-abc", "its end", write, give_up_after_s=30)
    assert write.calls == 3


def test_a_database_away_past_the_limit_is_logged_and_given_up(caplog):
    write = DatabaseAway(times=100)
    assert not _record("quota-1-abc", "its end", write, give_up_after_s=1.0)
    assert 1 < write.calls < 5
    assert "could not record its end; giving up after 1 s" in caplog.text
