"""An in-memory SQLite database with the provider's tables, for the state-change functions."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from airflow_quota_provider.models.base import quota_metadata


@pytest.fixture
def session():
    engine = create_engine("sqlite://")
    quota_metadata.create_all(engine)
    with Session(engine) as s:
        yield s
