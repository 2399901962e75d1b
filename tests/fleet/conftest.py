"""The fleet of the fleet tests (see tests/fleet_support.py): one job queue of three GPU hosts of 4
virtual GPUs each, team-a and team-b 6 GPUs each; checkpoints in a directory the hosts share. A
second job queue, with GPU types, has its hosts started by the tests of types (test_types.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fleet_support import Fleet, running_fleet
from tests.integration_support import free_port

DAGS = Path(__file__).parent / "dags"
HOSTS = ("gpu-a", "gpu-b", "gpu-c")
GPUS_PER_HOST = 4
HOST_LOST_AFTER_S = 8

QUOTAS = """
queues:
  - name: gpu-fleet
    capacity: 12
    quotas:
      - {name: team-a, capacity: 6, grace_period_s: 10}
      - {name: team-b, capacity: 6, grace_period_s: 10}
  - name: gpu-typed
    capacity: {h100: 2, a100: 4}
    fungibility: {when_can_borrow: try_next_type}
    quotas:
      - {name: team-c, capacity: {h100: 1, a100: 3}, grace_period_s: 10}
      - {name: team-d, capacity: {h100: 1, a100: 1}, grace_period_s: 10}
"""


@pytest.fixture(scope="session")
def fleet(tmp_path_factory) -> Fleet:
    home = tmp_path_factory.mktemp("airflow-fleet")
    with running_fleet(
        home,
        quota_file=QUOTAS,
        dags_folder=DAGS,
        hosts=HOSTS,
        gpus_per_host=GPUS_PER_HOST,
        port=free_port(18040, 18069, also=50),
        redis_db=11,
        extra_env={
            "AIRFLOW__QUOTA__HOST_HEARTBEAT_S": "1",
            "AIRFLOW__QUOTA__HOST_LOST_AFTER_S": str(HOST_LOST_AFTER_S),
            "AIRFLOW__QUOTA__CHECKPOINT_ROOT": str(home / "shared-checkpoints"),
        },
    ) as instance:
        yield instance
