"""docker/compose.yaml, run without Docker (see compose_stack.py): every service's own command and
environment as a local process, init first, depends_on and healthchecks honoured, then the README's
borrow-then-reclaim story through that stack, logged in as the admin user the init service made.

A wrong command, variable or volume in the file fails here: a service that exits or never turns
healthy, a URL that does not match the postgres or redis service, tasks that cannot reach the
execution API, checkpoints or task logs that miss the shared volumes, a quota file not mounted.

Both schedulers run, as in the file: two QuotaExecutors share the job table (one decider per job
queue at a time, see docs/fleet.md), and whichever scheduler queued a task hears its outcome.
"""

from __future__ import annotations

import secrets

import pytest
import redis

from tests.containers.compose_stack import COMPOSE_FILE, ComposeStack, compose_config
from tests.containers.story import TRAINING_ENV, borrow_then_reclaim
from tests.fleet_support import _admin
from tests.integration_support import wait_for

REDIS_DB = 12  # the fleet tests use 11


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    config = compose_config(COMPOSE_FILE)
    database = f"quota_compose_{secrets.token_hex(4)}"
    _admin(f"CREATE DATABASE {database}")
    redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB).flushdb()
    instance = ComposeStack(tmp_path_factory.mktemp("compose"), config, database=database, redis_db=REDIS_DB,
                            host_env=TRAINING_ENV)
    try:
        instance.start()
        # Before the story: on two busy cores a healthcheck can miss its window while six trainings start
        # (`airflow jobs check` wants a heartbeat younger than 10.5 s).
        instance.assert_healthy()
        init_env = instance.container_env("airflow-init")
        instance.login(init_env["_AIRFLOW_WWW_USER_USERNAME"], init_env["_AIRFLOW_WWW_USER_PASSWORD"])
        yield instance
    finally:
        instance.stop()
        _admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def test_the_compose_file_runs_the_borrow_then_reclaim_story(stack):
    # Both GPU hosts registered their 4 virtual GPUs under the name the file gives them.
    wait_for(lambda: {r["name"]: (r["queues"], r["devices"]) for r in stack.sql("SELECT * FROM quota_host")}
             == {"gpu-host-1": ("gpu-fleet", "0,1,2,3"), "gpu-host-2": ("gpu-fleet", "0,1,2,3")},
             "gpu-host-1 and gpu-host-2 in quota_host", timeout=120, on_timeout=lambda: stack.tail("gpu-host-1"))
    borrow_then_reclaim(stack, checkpoints=stack.volumes_dir / "checkpoints", logs=stack.volumes_dir / "airflow-logs",
                        scheduler="airflow-scheduler")

