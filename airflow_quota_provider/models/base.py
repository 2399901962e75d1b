"""The provider's own SQLAlchemy metadata, kept apart from Airflow's so that its DB manager migrates it."""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

quota_metadata = MetaData()


class QuotaBase(DeclarativeBase):
    """Declarative base of every quota table; its metadata is :data:`quota_metadata`."""

    metadata = quota_metadata
