"""The "GPU quota job" link of a quota task instance: the quota page opened on its job.

Airflow 3 resolves an operator's own links from XCom, which the task writes when a run ends, so a
task that waits for quota before its first run would have none. The link is therefore the plugin's
(``QuotaPlugin.operator_extra_links``): the api-server calls :meth:`QuotaJobLink.get_link` itself
whenever the task instance's page asks, built from the task instance key alone, without the
database. Our operators carry no link of their own, so their runs write no XCom for it: one
api-server round trip fewer at every run's end, which is on a preempted task's way to freeing its
GPUs. The plugin names classes exactly (by module and name), so a subclass of the operator in
another module gets the link as its own (:class:`~.training.QuotaTaskMixin`), from the XCom once a
run has ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

from airflow.sdk import BaseOperatorLink

from airflow_quota_provider.plugins import URL_PREFIX, base_url

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


def quota_page_url(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """The quota page opened on the job of this task instance: its state, reason and position while
    it waits, estimated start, and the audit log of the job (its preemptions)."""
    query = urlencode({"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": map_index}, quote_via=quote)
    return f"{base_url()}{URL_PREFIX}/ui/?{query}"


def linked_by_plugin(operator: type) -> bool:
    """Whether the plugin gives ``operator`` the link: one of :attr:`QuotaJobLink.operators`, all
    in this package (the check cannot import them: they are being defined when it is asked)."""
    return operator.__module__.partition(".")[0] == __name__.partition(".")[0]


class QuotaJobLink(BaseOperatorLink):
    """Extra link of QuotaTrainingOperator and ``@task.quota`` tasks to their job on the quota page."""

    name = "GPU quota job"

    @property
    def operators(self) -> list[type[BaseOperator]]:
        """The operators the plugin attaches the link to (imported here: they import this module)."""
        from airflow_quota_provider.decorators.quota import _QuotaDecoratedOperator
        from airflow_quota_provider.operators.training import QuotaTrainingOperator

        return [QuotaTrainingOperator, _QuotaDecoratedOperator]

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        return quota_page_url(ti_key.dag_id, ti_key.run_id, ti_key.task_id, ti_key.map_index)
