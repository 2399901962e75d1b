"""What several schedulers share: the database's clock, and one decider at a time per job queue.

Two schedulers run a QuotaExecutor each over the same tables. Each cycle takes, per job queue, a
PostgreSQL advisory lock *in the transaction that writes the cycle's decisions* and without
waiting: the scheduler that gets it reads, decides and acts for that queue; the other skips the
queue this heartbeat. Taking the lock before reading means the winner reads everything the other
committed (READ COMMITTED: each statement sees the latest commit), so nobody acts on a stale view.
The lock goes with the transaction's commit or rollback, also when a scheduler dies.

Airflow's own ``create_global_lock`` does not fit: it blocks, and its ids are fixed (DESIGN §7).
SQLite has no such locks: one scheduler only (the executor says so at start when it sees another).
"""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING

from sqlalchemy import text

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sqlalchemy.orm import Session

HOSTS = "hosts"
"""The lock of the host checks (marking silent hosts lost), which span job queues."""
UNQUEUED = "jobs without a job queue"
"""The lock of jobs whose quota no job queue has (they are rejected once, by one scheduler)."""
POOLS = "quota pools"
"""The lock of creating and updating the quotas' Airflow pools (two schedulers starting at once would
both insert the same pool)."""
METRICS = "quota metrics"
"""The lock of the metrics' shared cursors (:mod:`.meter`): one scheduler sends each count."""
LOCK_IDLE_TIMEOUT_S = 60.0
"""A cycle's transaction idle this long (between two statements) is ended by PostgreSQL, and with
it the locks it holds; a live cycle never idles near this long."""


def lock_id(name: str) -> int:
    """A stable signed 64-bit advisory lock id for ``name``, in a space of our own (Airflow's
    scheduler uses small fixed ids)."""
    digest = hashlib.blake2b(f"airflow-quota-provider/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def try_lock(names: Iterable[str], *, session: Session, idle_timeout_s: float = LOCK_IDLE_TIMEOUT_S) -> set[str]:
    """The names among ``names`` whose lock this transaction now holds (all of them off PostgreSQL)."""
    names = list(names)
    if not names or not _postgres(session):
        return set(names)
    # One round trip for all the queues of the quota file (at most a few dozen). The session is
    # ended if this transaction idles past ``idle_timeout_s``: a scheduler killed mid-cycle whose
    # connection lives on (its forked log server shares the socket, or a half-open TCP link) would
    # otherwise hold its queues' locks for ever, and no scheduler would decide them again.
    ids = [lock_id(n) for n in names]
    got = session.execute(
        text(
            "WITH guard AS (SELECT set_config('idle_in_transaction_session_timeout', :idle_ms, true)) "
            "SELECT id, pg_try_advisory_xact_lock(id) FROM guard, unnest(CAST(:ids AS bigint[])) AS id"
        ),
        {"ids": ids, "idle_ms": str(int(idle_timeout_s * 1000))},
    ).all()
    held = {i for i, ok in got if ok}
    return {n for n, i in zip(names, ids) if i in held}


def lock(name: str, *, session: Session) -> None:
    """Wait for ``name``'s lock (for rare writes outside a cycle, such as a revoke)."""
    if _postgres(session):
        session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": lock_id(name)})


def db_now(session: Session) -> float:
    """Seconds since the epoch by the database's clock: the one clock every scheduler and host
    shares, so that a machine whose clock runs ahead cannot move its jobs' times."""
    if _postgres(session):
        return float(session.scalar(text("SELECT EXTRACT(EPOCH FROM clock_timestamp())")))
    return time.time()
