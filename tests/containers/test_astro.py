"""The Astro project's effective configuration runs the story: the Dockerfile's ENV and the
scheduler's environment from docker-compose.override.yml (what `astro dev start` lays over Astro's
own LocalExecutor), with the project's DAGs and quota file, applied to a local api-server,
dag-processor and scheduler (tests/integration_support.py), paths under the Runtime's
/usr/local/airflow read in docker/astro.

The instance's own defaults are made useless on purpose (LocalExecutor, a quota file that says
nothing): the story passes only if the project's settings take their place."""

from __future__ import annotations

import yaml

from tests.containers.dockerfile import Dockerfile
from tests.containers.story import TRAINING_ENV, borrow_then_reclaim
from tests.integration_support import REPO, AirflowInstance, free_port

ASTRO = REPO / "docker" / "astro"
RUNTIME_HOME = "/usr/local/airflow"  # where Astro puts the project in its image


def astro_environment(service: str = "scheduler") -> dict[str, str]:
    """Dockerfile ENV, then the override's environment for ``service`` (compose wins over ENV)."""
    override = yaml.safe_load((ASTRO / "docker-compose.override.yml").read_text())
    env = {**Dockerfile.read(ASTRO / "Dockerfile").env(), **override["services"][service]["environment"]}
    return {k: str(v).replace(RUNTIME_HOME, str(ASTRO)) for k, v in env.items()}


def test_the_astro_project_s_configuration_runs_the_borrow_then_reclaim_story(tmp_path):
    env = astro_environment()
    assert env["AIRFLOW__QUOTA__QUOTA_FILE"] == str(ASTRO / "include" / "quotas.yaml")
    instance = AirflowInstance(
        tmp_path / "astro",
        port=free_port(18500, 18549, also=50),
        quota_file="# not the project's quota file: the project's settings must name include/quotas.yaml\n",
        dags_folder=ASTRO / "dags",  # Astro's: $AIRFLOW_HOME/dags
        executor="LocalExecutor",  # what Astro's own compose file sets
        extra_env={**TRAINING_ENV, **env},
    )
    try:
        instance.start()
        borrow_then_reclaim(instance, checkpoints=instance.home / "quota" / "checkpoints", logs=instance.home / "logs")
    finally:
        instance.stop()
