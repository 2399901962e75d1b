"""Run the example DAG ``aws_batch_training`` with ``dag.test()`` against the AWS fake (a test subprocess).

Usage: ``python aws_dag_driver.py DAG_FILE DAG_ID`` with AIRFLOW_HOME, AIRFLOW_CONN_AWS_DEFAULT set.
Creates the metadata DB, runs the DAG (retries, deferral and the trigger run in this process, as
``dag.test`` does), and prints one JSON line: the run state, every task instance's final state and
try number, and the XComs of the run.
"""

from __future__ import annotations

import importlib.util
import json
import sys


def main(dag_file: str, dag_id: str) -> int:
    from airflow.utils.db import initdb

    initdb()

    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    spec = importlib.util.spec_from_file_location("aws_example_dag", dag_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = next(v for v in vars(module).values() if getattr(v, "dag_id", None) == dag_id and hasattr(v, "test"))
    run = dag.test()
    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run.run_id)
        ).all()
        xcoms = session.scalars(
            select(XComModel).where(XComModel.dag_id == dag_id, XComModel.run_id == run.run_id)
        ).all()
        result = {
            "state": str(run.state),
            "tasks": {ti.task_id: {"state": str(ti.state), "try_number": ti.try_number} for ti in tis},
            "xcom": {f"{x.task_id}.{x.key}": x.value for x in xcoms},
        }
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
