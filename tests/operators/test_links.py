"""The "GPU quota job" link: its URL, and its resolution by the api-server from the task instance key
alone (no XCom: a task waiting for its first run has not written one, and our operators' runs write
none at their end)."""

from __future__ import annotations

from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest

import tests.operators.quota_airflow  # noqa: F401  first: it keeps Airflow away from ~/airflow
from airflow_quota_provider.get_provider_info import get_provider_info
from airflow_quota_provider.operators.links import QuotaJobLink, linked_by_plugin, quota_page_url
from airflow_quota_provider.operators.training import QuotaTrainingOperator

ODD_RUN_ID = "manual__2026-12-06T21:00:00+00:00/a b&task_id=x#frag?%20é"


def _query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query, keep_blank_values=True, strict_parsing=True)


def test_the_url_carries_an_odd_run_id_back_unchanged():
    url = quota_page_url("train_dag", ODD_RUN_ID, "train", 3)
    assert url.startswith("/quota/ui/?") and "#" not in url and " " not in url
    assert _query(url) == {"dag_id": ["train_dag"], "run_id": [ODD_RUN_ID], "task_id": ["train"], "map_index": ["3"]}


def test_the_url_is_absolute_under_the_configured_base_url(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/prefix/")
    assert quota_page_url("d", "r", "t").startswith("https://airflow.example.com/prefix/quota/ui/?dag_id=d&")


def test_the_provider_declares_the_link():
    (name,) = get_provider_info()["extra-links"]
    module, cls = name.rsplit(".", 1)
    assert (module, cls) == (QuotaJobLink.__module__, QuotaJobLink.__name__)


class TeamTraining(QuotaTrainingOperator):
    """A subclass in a DAG author's module: the plugin, which names classes exactly, does not know it."""


@pytest.fixture(scope="module")
def api_server_dag():
    """A DAG with each kind of quota task, serialized and read back with its links as the api-server
    reads it (the plugins' links loaded)."""
    from airflow.sdk import DAG, task
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("links_dag", schedule=None) as dag:
        QuotaTrainingOperator(task_id="operator", quota="team-a", command="true")
        TeamTraining(task_id="subclass", quota="team-a", command="true")

        @task.quota(quota="team-a")
        def decorated():
            pass

        @task.quota(quota="team-a")
        def mapped(x):
            pass

        decorated()
        mapped.expand(x=[1, 2])
    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


@pytest.mark.parametrize(("task_id", "map_index"), [("operator", -1), ("decorated", -1), ("mapped", 1)])
def test_the_api_server_resolves_the_link_from_the_task_instance_key(api_server_dag, task_id, map_index):
    from airflow.models.taskinstancekey import TaskInstanceKey

    task = api_server_dag.get_task(task_id)
    assert list(task.extra_links) == ["GPU quota job"]
    assert isinstance(task.operator_extra_link_dict["GPU quota job"], QuotaJobLink)  # the plugin's, not XCom's
    ti = SimpleNamespace(key=TaskInstanceKey("links_dag", task_id, ODD_RUN_ID, 1, map_index))
    url = task.get_extra_links(ti, "GPU quota job")
    assert _query(url) == {"dag_id": ["links_dag"], "run_id": [ODD_RUN_ID], "task_id": [task_id],
                           "map_index": [str(map_index)]}


def test_our_operators_carry_no_link_of_their_own_so_a_run_writes_no_xcom_at_its_end():
    # The task runner pushes an XCom per link of the operator's own when a run ends (an api-server
    # round trip before a preempted task's process exits and its GPUs are free).
    from airflow_quota_provider.decorators.quota import _QuotaDecoratedOperator

    assert QuotaTrainingOperator.operator_extra_links == () and _QuotaDecoratedOperator.operator_extra_links == ()
    assert set(QuotaJobLink().operators) == {QuotaTrainingOperator, _QuotaDecoratedOperator}
    assert all(linked_by_plugin(operator) for operator in QuotaJobLink().operators)


def test_a_subclass_the_plugin_cannot_name_keeps_the_link_from_its_runs_xcom(api_server_dag):
    from airflow.serialization.definitions.operatorlink import XComOperatorLink

    assert not linked_by_plugin(TeamTraining)
    assert [type(link) for link in TeamTraining.operator_extra_links] == [QuotaJobLink]
    link = api_server_dag.get_task("subclass").operator_extra_link_dict["GPU quota job"]
    assert isinstance(link, XComOperatorLink) and link.xcom_key == QuotaJobLink().xcom_key
