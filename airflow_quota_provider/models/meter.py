"""How far the metrics' counters have counted, shared by every scheduler.

Each scheduler's QuotaExecutor sends the counters (:mod:`airflow_quota_provider.metrics`), so each
kept its own cursor, and with two schedulers every admission and every GPU-second was counted twice.
The cursors live here instead, read and moved under one lock (:data:`~.coordination.METRICS`) in
the transaction of the cycle that sends: one scheduler counts each span, once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Float, String
from sqlalchemy.orm import Mapped, mapped_column

from airflow_quota_provider.models.base import QuotaBase

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

EVENTS = "events"
"""The id of the last audit event turned into counters."""
GPU_SECONDS = "gpu_seconds"
"""The time (database clock) up to which GPU-seconds were counted."""


class QuotaMeter(QuotaBase):
    """One cursor of the metrics."""

    __tablename__ = "quota_meter"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    position: Mapped[float] = mapped_column(Float, nullable=False)


def position(name: str, *, session: Session) -> float | None:
    """Where the cursor ``name`` stands; None before the first count."""
    meter = session.get(QuotaMeter, name)
    return None if meter is None else meter.position


def move(name: str, to: float, *, session: Session) -> None:
    """Move the cursor ``name`` to ``to`` (committed with the caller's transaction)."""
    session.merge(QuotaMeter(name=name, position=to))
