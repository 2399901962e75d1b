"""`astro dev pytest` runs this in the project's image: the DAGs ./prepare copied from the repository
import, and they are the quota examples (the AWS Batch one is left out by dags/.airflowignore)."""

import os
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parents[2]
# The scheduler's settings at `astro dev start` (docker-compose.override.yml), before Airflow reads
# its configuration: the DAGs' tasks name its executor, and a DAG whose executor is unknown fails.
OVERRIDE = yaml.safe_load((PROJECT / "docker-compose.override.yml").read_text())
os.environ.update(OVERRIDE["services"]["scheduler"]["environment"])

from airflow.dag_processing.dagbag import DagBag  # noqa: E402

QUOTA_DAGS = {"quota_team_b_sweep", "quota_team_a_finetune", "quota_team_a_pretrain", "quota_inference_eval"}


def test_the_project_s_dags_import_and_are_the_quota_examples():
    bag = DagBag()  # $AIRFLOW_HOME/dags; Airflow 3.3 loads no example DAGs here
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == QUOTA_DAGS
