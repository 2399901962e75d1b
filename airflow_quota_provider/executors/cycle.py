"""One heartbeat of the executor, as every part of it sees it: one session and one clock.

:class:`~airflow_quota_provider.executors.quota_executor.QuotaExecutor` begins a :class:`Cycle`
per heartbeat and passes it to its parts (:mod:`.reconcile`, :mod:`.schedule`, :mod:`.act`); they
keep no cycle state of their own, so a part does the same whether a whole Airflow or a test drives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_quota_provider.models.coordination import UNQUEUED, db_now, try_lock

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow_quota_provider.policy import QuotaFile


@dataclass(frozen=True)
class Cycle:
    session: Session
    """The cycle's transaction: what the parts write commits together, and the locks it took go
    with that commit (the actor's, before it launches, or the end of the heartbeat's)."""
    now: float
    """Seconds since the epoch by the database's clock (:func:`db_now`), which every scheduler shares."""
    quota_file: QuotaFile
    """The quota file in force this cycle."""
    locked: frozenset[str]
    """The job queues (and :data:`UNQUEUED`) whose lock this cycle holds: it decides for those only."""
    scheduler_job: int | None = None
    """The job id of the scheduler this executor runs in (None outside one)."""

    @classmethod
    def begin(cls, session: Session, quota_file: QuotaFile, scheduler_job: int | None = None) -> Cycle:
        """Read the clock and take the locks of the job queues the other scheduler does not hold."""
        now = db_now(session)
        locked = try_lock([q.name for q in quota_file.queues] + [UNQUEUED], session=session)
        return cls(session, now, quota_file, frozenset(locked), scheduler_job)

    @property
    def missed(self) -> bool:
        """Whether the other scheduler held some of the locks: it may decide on what this one saw."""
        return len(self.locked) < len(self.quota_file.queues) + 1
