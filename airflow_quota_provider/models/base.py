"""The provider's own SQLAlchemy metadata, kept apart from Airflow's so that its DB manager migrates it."""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

quota_metadata = MetaData()

PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1
"""A job's priority is a 32-bit signed integer: the range of Airflow's own ``priority_weight``
(``DB_SAFE_MINIMUM``/``DB_SAFE_MAXIMUM``), which a task's priority comes from, and of the job table's
``priority`` column on every database Airflow supports. The REST body and the CLI both check it."""


class QuotaBase(DeclarativeBase):
    """Declarative base of every quota table; its metadata is :data:`quota_metadata`."""

    metadata = quota_metadata
