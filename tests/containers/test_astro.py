"""The Astro project's effective configuration runs the story: the Dockerfile's ENV and the
scheduler's environment from docker-compose.override.yml (what `astro dev start` lays over Astro's
own LocalExecutor), with the DAGs and quota file ./prepare copies from the repository, applied to a
local api-server, dag-processor and scheduler (tests/integration_support.py), paths under the
Runtime's /usr/local/airflow read in a prepared copy of docker/astro.

The instance's own defaults are made useless on purpose (LocalExecutor, a quota file that says
nothing): the story passes only if the project's settings take their place."""

from __future__ import annotations

from tests.containers.astro_project import astro_environment, prepared_project
from tests.containers.story import TRAINING_ENV, borrow_then_reclaim
from tests.integration_support import AirflowInstance, free_port


def test_the_astro_project_s_configuration_runs_the_borrow_then_reclaim_story(tmp_path):
    project = prepared_project(tmp_path / "project")
    env = astro_environment(project)
    assert env["AIRFLOW__QUOTA__QUOTA_FILE"] == str(project / "include" / "quotas.yaml")
    instance = AirflowInstance(
        tmp_path / "astro",
        port=free_port(18500, 18549, also=50),
        quota_file="# not the project's quota file: the project's settings must name include/quotas.yaml\n",
        dags_folder=project / "dags",  # Astro's: $AIRFLOW_HOME/dags
        executor="LocalExecutor",  # what Astro's own compose file sets
        extra_env={**TRAINING_ENV, **env},
    )
    try:
        instance.start()
        borrow_then_reclaim(instance, checkpoints=instance.home / "quota" / "checkpoints", logs=instance.home / "logs")
    finally:
        instance.stop()
