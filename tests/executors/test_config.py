"""QuotaExecutor's configuration: a hostile or colliding quota file is a QuotaConfigError (the
executor's config_rejected path), and a running configuration survives a bad edit."""

from __future__ import annotations

import os

import pytest

from airflow_quota_provider.executors.config import MANAGED_POOL, QuotaConfig, pool_collisions
from airflow_quota_provider.quota_file import QuotaConfigError
from airflow_quota_provider.policy import parse_quota_file
from tests.policy.test_documents import billion_laughs

GOOD = "queues:\n- name: q\n  capacity: 2\n  quotas: [{name: team-a, capacity: 2}]\n"


def _edit(path, content: bytes) -> None:
    path.write_bytes(content)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a new mtime, however fast


@pytest.mark.parametrize(
    ("content", "named"),
    [
        pytest.param(billion_laughs().encode(), "more than 200000 values", id="billion laughs"),
        pytest.param("queues:\n- name: café\n".encode("latin-1"), "not UTF-8", id="not UTF-8"),
        pytest.param(b"queues: " + b"[" * 3000 + b"]" * 3000, "nested deeper", id="deep nesting"),
        pytest.param(GOOD.replace("capacity: 2\n", "capacity: " + "9" * 5000 + "\n", 1).encode(),
                     "queues[0].capacity", id="thousands of digits"),
        pytest.param(GOOD.replace("team-a", "default_pool").encode(), "queues[0].quotas[0].name: 'default_pool'",
                     id="Airflow's default pool"),
    ],
)
def test_a_bad_edit_is_a_config_error_and_the_last_good_file_stays(tmp_path, content, named):
    path = tmp_path / "quotas.yaml"
    path.write_text(GOOD)
    config = QuotaConfig(str(path), ["0", "1"], pools=dict)
    good = config.quota_file
    _edit(path, content)
    with pytest.raises(QuotaConfigError) as raised:
        config.reload()
    assert named in str(raised.value) and len(str(raised.value)) < 1000
    assert config.quota_file is good
    _edit(path, GOOD.replace("team-a", "team-b").encode())
    assert config.reload() and config.quota_file.queues[0].quotas[0].name == "team-b"


def test_quota_names_may_not_take_pools_the_executor_does_not_manage():
    quota_file = parse_quota_file(
        {"queues": [{"name": "q", "capacity": 4, "quotas": [
            {"name": "default_pool", "capacity": 1},
            {"name": "etl-pool", "capacity": 1},
            {"name": "team-a", "capacity": 1},
            {"name": "team-new", "capacity": 1},
        ]}]}
    )
    pools = {
        "default_pool": "Default pool",
        "etl-pool": "for the ETL DAGs",
        "team-a": f"Shared quota team-a of job queue q: 1 GPUs, lend_and_borrow {MANAGED_POOL}",
    }
    errors = pool_collisions(quota_file, pools)
    assert [e.split(":")[0] for e in errors] == ["queues[0].quotas[0].name", "queues[0].quotas[1].name"]
    assert "Airflow's default pool" in errors[0] and "does not manage" in errors[1]
    # default_pool is refused even where the database cannot be read.
    assert len(pool_collisions(quota_file, {})) == 1
