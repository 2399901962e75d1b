"""Run one DAG with ``dag.test()`` and report every task attempt (a subprocess of the tests).

Usage: ``python dag_test_driver.py DAG_FILE DAG_ID RESULT_JSON`` (``DAG_TEST_RUN_CONF``: the run's conf, JSON)

After each attempt of a task (``dag.test`` runs attempts through the Task SDK's in-process
supervisor, one after another, re-running ``UP_FOR_RESCHEDULE`` tasks with the same
``try_number`` as the scheduler does) the task instance row is read back from the metadata DB, so
the result shows the state an attempt ended in, not only the final one. The wrapper only
observes; it does not change what Airflow does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys


def _key(ti) -> str:
    return ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"


def main(dag_file: str, dag_id: str, result_path: str) -> int:
    import airflow.sdk.definitions.dag as dag_module
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    attempts: list[dict] = []
    run_task = dag_module._run_task

    def observed_run_task(*, ti, task, run_triggerer=False):
        try:
            return run_task(ti=ti, task=task, run_triggerer=run_triggerer)
        finally:
            with create_session() as session:
                row = session.get(TaskInstance, ti.id)
                attempt = {"task_id": row.task_id, "state": str(row.state), "try_number": row.try_number}
                attempts.append(attempt if row.map_index < 0 else {**attempt, "map_index": row.map_index})

    dag_module._run_task = observed_run_task

    spec = importlib.util.spec_from_file_location(f"dag_under_test_{dag_id}", dag_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = next(v for v in vars(module).values() if getattr(v, "dag_id", None) == dag_id and hasattr(v, "test"))

    dag_run = dag.test(run_conf=json.loads(os.environ.get("DAG_TEST_RUN_CONF") or "null"))
    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == dag_run.run_id)
        ).all()
        final = {_key(ti): {"state": str(ti.state), "try_number": ti.try_number, "ti_id": str(ti.id)} for ti in tis}
        reschedules = {
            _key(ti): session.scalar(
                select(func.count()).select_from(TaskReschedule).where(TaskReschedule.ti_id == ti.id)
            )
            for ti in tis
        }
    result = {"dag_run_state": str(dag_run.state), "attempts": attempts, "final": final, "reschedules": reschedules}
    with open(result_path, "w") as f:
        json.dump(result, f)
    print("DRIVER RESULT", json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
