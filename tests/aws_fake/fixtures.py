"""pytest fixtures: a fresh fake per test, and the ``aws_default`` connection pointing at it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.aws_fake.batch import FakeBatch, FakeBatchServer

JOB_QUEUE = "gpu-fleet"


@pytest.fixture
def aws_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBatch]:
    """A :class:`FakeBatch` with one SAGEMAKER_TRAINING job queue (``gpu-fleet``), served on 127.0.0.1.

    ``AIRFLOW_CONN_AWS_DEFAULT`` points at it with fake credentials, so hooks, operators, sensors
    and triggers built with ``aws_conn_id="aws_default"`` reach it through boto3.
    """
    with FakeBatchServer() as server:
        conn = {
            "conn_type": "aws",
            "login": "testing",
            "password": "testing",
            "extra": {"endpoint_url": server.endpoint_url, "region_name": "us-east-1"},
        }
        monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(conn))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        server.batch.add_job_queue(JOB_QUEUE)
        server.batch.endpoint_url = server.endpoint_url  # type: ignore[attr-defined]
        yield server.batch
