"""Run one DAG with ``dag.test()`` and report every task attempt (a subprocess of the tests).

Usage: ``python dag_test_driver.py DAG_FILE DAG_ID RESULT_JSON``; ``DAG_TEST_RUN_CONF``: the run's
conf (JSON).

``dag.test`` schedules the run itself, re-running ``UP_FOR_RESCHEDULE`` tasks with the same
``try_number`` as the scheduler does. By default it runs each attempt in this process through the
Task SDK's in-process supervisor. With ``DAG_TEST_SUPERVISE=1`` each attempt runs the way an
executor runs it instead: ``supervise_task`` (the production supervisor) forks a real task
process that parses the DAG file, and talks to the Execution API served in-process
(``InProcessExecutionAPI``, DESIGN §5). This process is then the supervisor: SIGTERM sent to it is
forwarded to the task process, as an executor's would be.

After each attempt the task instance row is read back from the metadata DB, so the result shows
the state every attempt ended in, not only the final one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path


def _key(ti) -> str:
    return ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"


def _supervised_runner(dag_file: str):
    """A replacement for dag.test's in-process runner that runs the attempt in a real task process."""
    from airflow.api_fastapi.execution_api.app import InProcessExecutionAPI
    from airflow.executors.workloads import BundleInfo
    from airflow.sdk.api.client import Client
    from airflow.sdk.api.datamodels._generated import TaskInstance as TaskInstanceSDK
    from airflow.sdk.execution_time.supervisor import supervise_task
    from airflow.utils.state import TaskInstanceState

    api = InProcessExecutionAPI()

    def run_task(*, ti, task, run_triggerer=False):
        ti.set_state(TaskInstanceState.QUEUED)  # as an executor receives it
        supervise_task(
            ti=TaskInstanceSDK(
                id=ti.id,
                task_id=ti.task_id,
                dag_id=ti.dag_id,
                run_id=ti.run_id,
                try_number=ti.try_number,
                map_index=ti.map_index,
                dag_version_id=ti.dag_version_id,
            ),
            bundle_info=BundleInfo(name="dags-folder", version=None),
            dag_rel_path=Path(dag_file).name,
            token="",
            client=Client(base_url="http://in-process.invalid/", token="", transport=api.transport),
            subprocess_logs_to_stdout=True,
        )

    return run_task


def main(dag_file: str, dag_id: str, result_path: str) -> int:
    import airflow.sdk.definitions.dag as dag_module
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    attempts: list[dict] = []
    run_task = _supervised_runner(dag_file) if os.environ.get("DAG_TEST_SUPERVISE") == "1" else dag_module._run_task

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
