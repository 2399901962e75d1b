"""REST service functions over a seeded SQLite database, without the api-server."""

from __future__ import annotations

import time

import pytest
import yaml
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from airflow_quota_provider.models.base import quota_metadata
from airflow_quota_provider.models.job import JobState, QuotaEvent, QuotaJob
from airflow_quota_provider.plugins import services
from airflow_quota_provider.policy import parse_quota_file
from tests.plugins.seed import seed_into
from tests.quota_api_support import BASELINE, QUOTAS


def test_cohorts_show_their_subtrees_and_quotas_name_their_cohort(tmp_path):
    data = yaml.safe_load(QUOTAS)
    fleet = data["queues"][0]
    fleet["capacity"] = 10
    fleet["cohorts"] = [{"name": "ml", "capacity": 2, "lend_limit": 1}]
    fleet["quotas"][0]["cohort"] = "ml"
    quota_file = parse_quota_file(data)
    engine = create_engine(f"sqlite:///{tmp_path / 'quota.db'}")
    quota_metadata.create_all(engine)
    with Session(engine) as session:
        seed_into(list(BASELINE), session=session)
        (ml,) = services.cohorts(quota_file, session=session).cohorts
        quotas = {q.name: q for q in services.quotas(quota_file, session=session).quotas}
        queue = next(q for q in services.queues(quota_file, session=session).queues if q.name == "gpu-fleet")
        (page, _) = services.dashboard(quota_file, "quotas.yaml", session=session).queues
    assert ml.model_dump() == {
        "name": "ml", "queue": "gpu-fleet", "parent": None, "capacity": 2, "subtree_capacity": 6, "in_use": 2,
        "borrowed": 0, "lent": 1, "borrow_limit": None, "lend_limit": 1, "types": None,
    }
    assert (quotas["team-a"].cohort, quotas["team-b"].cohort) == ("ml", None)
    assert queue.common_pool == 0
    # the quota page draws team-a inside cohort ml's box, team-b in the queue's
    assert [(c.name, c.parent, c.capacity, c.in_use, c.lent) for c in page.cohorts] == [("ml", None, 6, 2, 1)]
    assert [(q.name, q.cohort) for q in page.quotas] == [("team-a", "ml"), ("team-b", None)]


# ---------------------------------------------------------------------------------- usage: bad input, CSV

def _session(tmp_path) -> Session:
    engine = create_engine(f"sqlite:///{tmp_path / 'quota.db'}")
    quota_metadata.create_all(engine)
    return Session(engine)


@pytest.mark.parametrize(
    ("since", "until", "every", "field"),
    [
        pytest.param("nan", None, None, "since", id="since NaN"),
        pytest.param("inf", None, None, "since", id="since infinity"),
        pytest.param("0", "-inf", None, "until", id="until minus infinity"),
        pytest.param("0", "1e20", None, "until", id="until past the year 9999"),
        pytest.param("-86400", "0", None, "since", id="since before 1970"),
        pytest.param("0", "1e9", None, "until", id="a range over ten years"),
        pytest.param("100", "100", None, "until", id="a zero-length range"),
        pytest.param("200", "100", None, "until", id="since after until"),
        pytest.param("2026-02-30T00:00:00Z", None, None, "since", id="an ISO date that does not exist"),
        pytest.param("0", "86400000", 60, "every", id="too many buckets"),
    ],
)
def test_usage_refuses_bad_times_naming_the_field(tmp_path, since, until, every, field):
    quota_file = parse_quota_file(yaml.safe_load(QUOTAS))
    with _session(tmp_path) as session, pytest.raises(services.BadRequest, match=f"^{field}: "):
        # Installed at the epoch: no span asked for starts before the install (a report starts there at the earliest).
        session.add(QuotaEvent(at=0, kind="config_loaded", message="quotas.yaml"))
        services.usage(quota_file, since, until, "quota", every, session=session)


def test_the_usage_csv_escapes_a_dag_id_that_starts_like_a_formula(tmp_path):
    quota_file = parse_quota_file(yaml.safe_load(QUOTAS))
    now = time.time()
    with _session(tmp_path) as session:
        job = QuotaJob(dag_id="-2+3+cmd|' /C calc'!A0", run_id="r", task_id="t", quota="team-a", gpus=1,
                       state=JobState.FINISHED.value, submitted_at=now - 600, finished_at=now - 60)
        session.add(job)
        session.flush()
        for kind, at in (("admitted", now - 600), ("released", now - 60)):
            session.add(QuotaEvent(at=at, kind=kind, job_id=job.id, dag_id=job.dag_id, quota="team-a", devices="0"))
        session.flush()
        text = services.usage_csv(quota_file, str(now - 3600), str(now), "dag", session=session)
    assert text.splitlines()[1].startswith("'-2+3+cmd|' /C calc'!A0,"), text


# ------------------------------------------------------------------------- jobs: holdings and waits


def test_running_jobs_say_what_they_borrow_and_whether_a_lender_may_reclaim_them(tmp_path):
    quota_file = parse_quota_file(yaml.safe_load(QUOTAS))
    cases = [
        *BASELINE,
        # team-b's second job, at a lower priority: a reclaim would stop it first, so it holds borrowed GPUs first.
        {"case": "team_b_low", "quota": "team-b", "gpus": 1, "priority": 1, "state": "running", "devices": ["7"]},
    ]
    never = yaml.safe_load(QUOTAS)
    never["queues"][0]["quotas"][0]["preemption"] = {"reclaim": "never"}
    with _session(tmp_path) as session:
        seed_into(cases, session=session)
        jobs = {j.task_id: j for j in services.jobs(quota_file, quota=None, states=["running"], limit=100, offset=0,
                                                     session=session).jobs}
        quotas = {q.name: q for q in services.quotas(quota_file, session=session).quotas}
        unreclaimed = services.jobs(parse_quota_file(never), quota="team-b", states=["running"], limit=100, offset=0,
                                    session=session).jobs
    figures = {name: (j.owned_gpus, j.borrowed_gpus, j.reclaim_candidate) for name, j in jobs.items()}
    assert figures == {
        "team_b_borrower_running": (4, 1, True),  # team-a lends 2 and reclaims any priority
        "team_b_low": (0, 1, True),
        "team_a_running": (2, 0, False),
    }
    assert sum(j.borrowed_gpus for j in jobs.values() if j.quota == "team-b") == quotas["team-b"].borrowed
    assert [(j.borrowed_gpus, j.reclaim_candidate) for j in unreclaimed] == [(1, False), (1, False)]  # team-a never reclaims
    assert jobs["team_a_running"].max_priority == 100 and jobs["team_b_low"].max_priority is None
    assert all(j.preemption_limit is None and j.last_checkpoint_at is None for j in jobs.values())


def test_a_job_back_in_line_waits_since_it_went_back_not_since_its_first_submission(tmp_path):
    quota_file = parse_quota_file(yaml.safe_load(QUOTAS))
    with _session(tmp_path) as session:
        ids = seed_into(list(BASELINE), session=session)
        again = session.get(QuotaJob, ids["team_a_pending_behind"])
        session.add(QuotaEvent(at=time.time() - 10, kind="stopped", job_id=again.id, quota="team-a"))
        session.flush()
        jobs = {j.task_id: j for j in services.jobs(quota_file, quota="team-a", states=["pending"], limit=100,
                                                     offset=0, session=session).jobs}
        (fleet, _) = services.dashboard(quota_file, "quotas.yaml", session=session).queues
    now = time.time()
    assert 9 <= now - jobs["team_a_pending_behind"].waiting_since.timestamp() <= 15
    assert 94 <= now - jobs["team_a_pending_blocked"].waiting_since.timestamp() <= 100  # never ran: its submission
    waiting = {p.label.split(".")[1].split(" ")[0]: p.waiting_s for p in fleet.quotas[0].pending}
    assert 9 <= waiting["team_a_pending_behind"] <= 15 and 94 <= waiting["team_a_pending_blocked"] <= 100


def test_jobs_filtered_on_a_task_instance_are_its_tries_only(tmp_path):
    odd_run = "manual__2026-12-06T21:00:00+00:00/a b&c"
    with _session(tmp_path) as session:
        ids = seed_into([*BASELINE, {"case": "ti_filter_mapped", "quota": "team-lab"},
                         {"case": "ti_filter_other_run", "quota": "team-lab"}], session=session)
        session.get(QuotaJob, ids["ti_filter_mapped"]).map_index = 2
        other_run = session.get(QuotaJob, ids["ti_filter_other_run"])
        other_run.run_id, other_run.task_id = odd_run, "ti_filter_mapped"
        session.flush()

        def found(**task_instance) -> list[int]:
            page = services.jobs(None, quota=None, states=None, limit=100, offset=0, session=session, **task_instance)
            return [int(j.id) for j in page.jobs]

        mapped = {"dag_id": "quota_cases", "task_id": "ti_filter_mapped"}
        assert found(**mapped, run_id="seeded", map_index=2) == [ids["ti_filter_mapped"]]
        assert found(**mapped, run_id="seeded", map_index=-1) == []
        assert found(**mapped, run_id=odd_run, map_index=-1) == [ids["ti_filter_other_run"]]
        assert found(**mapped) == [ids["ti_filter_mapped"], ids["ti_filter_other_run"]]
        assert found(dag_id="quota_cases", run_id="seeded", task_id="team_a_running", map_index=-1) == [
            ids["team_a_running"]]


# ------------------------------------------------------------------------------------ priority changes


def _with_airflow_tables(session: Session) -> Session:
    """``session`` with Airflow's own tables too (a priority change writes to task_instance)."""
    import airflow.models
    from airflow.models.base import Base

    airflow.models.import_all_models()
    Base.metadata.create_all(session.connection())
    return session


def test_a_priority_change_is_what_the_task_instance_says_afterwards(tmp_path):
    import uuid

    from airflow.models.taskinstance import TaskInstance

    quota_file = parse_quota_file(yaml.safe_load(QUOTAS))
    with _with_airflow_tables(_session(tmp_path)) as session:
        ids = seed_into(list(BASELINE), session=session)
        job = session.get(QuotaJob, ids["team_a_pending_behind"])
        session.execute(TaskInstance.__table__.insert().values(
            id=uuid.uuid4(), dag_id=job.dag_id, run_id=job.run_id, task_id=job.task_id, map_index=-1, try_number=1,
            max_tries=0, hostname="", pool="team-a", pool_slots=1, queue="default", priority_weight=20,
            custom_operator_name="", executor_config=b"",
        ))
        changed = services.change_priority(str(job.id), 70, quota_file, by="op (quota page)", session=session)
        weight = session.scalar(select(TaskInstance.priority_weight).where(TaskInstance.task_id == job.task_id))
        with pytest.raises(ValueError, match="above quota team-a's max_priority 100"):
            services.change_priority(str(job.id), 101, quota_file, by="op (quota page)", session=session)
        weight_after_refusal = session.scalar(select(TaskInstance.priority_weight).where(TaskInstance.task_id == job.task_id))
    assert (changed.priority, weight, weight_after_refusal) == (70, 70, 70)


# ------------------------------------------------------------------------------------------- audit


def test_the_audit_log_filters_on_several_kinds_a_quota_and_a_job(tmp_path):
    quota_file = parse_quota_file(yaml.safe_load(QUOTAS))
    with _with_airflow_tables(_session(tmp_path)) as session:
        ids = seed_into(list(BASELINE), session=session)
        behind = str(ids["team_a_pending_behind"])
        services.change_priority(behind, 30, quota_file, by="op (REST API)", session=session)

        def kinds(**filters) -> list[str]:
            found = services.events(limit=100, offset=0, session=session, **{"quota": None, "job_id": None, **filters})
            return [e.kind for e in found.events]

        assert kinds(kinds=["preempted,priority_changed"]) == ["priority_changed", "preempted"]
        assert kinds(kinds=["preempted", "priority_changed"], quota="team-a") == ["priority_changed"]
        assert kinds(kinds=None, job_id=behind) == ["priority_changed", "submitted"]
        with pytest.raises(services.BadRequest, match="^kind: 'nope' is not one of submitted, admitted"):
            kinds(kinds=["preempted,nope"])


# ------------------------------------------------------------------------------------------- gangs

GANGS = [
    {"case": "gang_running", "quota": "team-a", "gpus": 4, "nodes": 2, "state": "running",
     "hosts": [["gpu-b", ["0", "1"]], ["gpu-a", ["2", "3"]]]},
    {"case": "gang_backing_off", "quota": "team-a", "gpus": 4, "nodes": 2, "backoff_s": 120, "start_failures": 2,
     "reason": "evicted (gang ended: node 1 of 2 on host gpu-c was never taken by its host); waiting to be queued again"},
    {"case": "gang_waiting", "quota": "team-a", "gpus": 4, "nodes": 2, "position": 2,
     "reason": "needs 2 hosts with 2 GPUs free, 1 has (gpu-c)"},
]


def test_a_gang_shows_each_node_on_its_host_and_when_its_backoff_ends(tmp_path):
    quota_file = parse_quota_file(yaml.safe_load(QUOTAS))
    with _session(tmp_path) as session:
        ids = seed_into(GANGS, session=session)
        page = services.jobs(quota_file, quota=None, states=None, limit=10, offset=0, session=session)
        (queue, _) = services.dashboard(quota_file, "quotas.yaml", session=session).queues
    by_task = {j.task_id: j for j in page.jobs}
    running, backing_off, waiting = (by_task[case] for case in ("gang_running", "gang_backing_off", "gang_waiting"))
    assert (running.nodes, running.host, running.hosts) == (2, "gpu-b", ["gpu-b", "gpu-a"])
    # node 0's devices, then every node's on its own host (not 0,1,2,3 on node 0's host)
    assert running.devices == ["0", "1"]
    assert [(n.host, n.devices) for n in running.placement] == [("gpu-b", ["0", "1"]), ("gpu-a", ["2", "3"])]
    assert (backing_off.hosts, backing_off.placement, backing_off.devices) == ([], [], [])
    assert backing_off.pending_reason.startswith("gang backing off after 2 failed starts: considered again in 1")
    assert backing_off.pending_reason.endswith("; evicted (gang ended: node 1 of 2 on host gpu-c was never taken by "
                                               "its host); waiting to be queued again")
    assert waiting.pending_reason == "needs 2 hosts with 2 GPUs free, 1 has (gpu-c)"
    pending = {p.id: p for quota in queue.quotas for p in quota.pending}
    assert (pending[str(ids["gang_waiting"])].nodes, pending[str(ids["gang_waiting"])].gpus) == (2, 4)
    assert pending[str(ids["gang_backing_off"])].reason == backing_off.pending_reason


# ------------------------------------------------------------------------------------------- GPU types

def test_a_typed_queue_and_its_quotas_show_their_figures_per_gpu_type_and_untyped_ones_none(tmp_path):
    from tests.test_usage import TYPED_JOBS, TYPED_QUOTAS

    quota_file = parse_quota_file(yaml.safe_load(TYPED_QUOTAS))
    with _session(tmp_path) as session:
        seed_into(list(TYPED_JOBS), session=session)
        quotas = {q.name: q for q in services.quotas(quota_file, session=session).quotas}
        mixed, lab = services.queues(quota_file, session=session).queues
        jobs = {j.task_id: j for j in services.jobs(quota_file, quota=None, states=None, limit=10, offset=0,
                                                     session=session).jobs}
        page = services.dashboard(quota_file, "quotas.yaml", session=session)

    assert [t.model_dump() for t in quotas["team-a"].types] == [
        {"name": "h100", "capacity": 2, "in_use": 3, "borrowed": 1, "lent": 0, "free": 1, "idle": 0},
        {"name": "a100", "capacity": 4, "in_use": 0, "borrowed": 0, "lent": 0, "free": 6, "idle": 4},
    ]
    assert (quotas["team-a"].capacity, quotas["team-a"].in_use, quotas["team-a"].borrowed) == (6, 3, 0)
    assert [(t.name, t.lent, t.idle) for t in quotas["team-b"].types] == [("h100", 1, 1), ("a100", 0, 2)]
    assert quotas["team-lab"].types is None

    assert [t.model_dump() for t in mixed.types] == [
        {"name": "h100", "capacity": 4, "in_use": 3, "instance_type": "ml.p5.48xlarge"},
        {"name": "a100", "capacity": 8, "in_use": 2, "instance_type": "ml.p4d.24xlarge"},
    ]
    assert mixed.fungibility.model_dump() == {"when_can_borrow": "try_next_type", "when_can_preempt": "try_next_type"}
    assert (lab.types, lab.fungibility) == (None, None)

    assert (jobs["team_a_on_h100"].gpu_types, jobs["team_a_on_h100"].gpu_type) == ([], "h100")
    # borrowed within its type: 3 h100s against team-a's 2 (its 6 GPUs in all would hide it), and team-b lends h100s
    on_h100 = jobs["team_a_on_h100"]
    assert (on_h100.owned_gpus, on_h100.borrowed_gpus, on_h100.reclaim_candidate) == (2, 1, True)
    assert (jobs["team_b_on_a100"].borrowed_gpus, jobs["team_b_on_a100"].reclaim_candidate) == (0, False)
    assert (jobs["team_b_waits_for_h100"].gpu_types, jobs["team_b_waits_for_h100"].gpu_type) == (["h100"], None)
    assert (jobs["team_lab_running"].gpu_types, jobs["team_lab_running"].gpu_type) == ([], None)

    typed, untyped = page.queues
    assert typed.types == ["h100: 4", "a100: 8"] and "try_next_type" in typed.fungibility
    team_a, team_b = typed.quotas
    assert [(t.name, t.owned, t.borrowed, t.lent, t.idle) for t in team_a.types] == [("h100", 2, 1, 0, 0), ("a100", 0, 0, 0, 4)]
    assert [j.gpu_types for j in team_b.pending] == [["h100"]]
    assert (untyped.types, untyped.fungibility, untyped.quotas[0].types) == ([], None, [])


def test_a_typed_cohort_shows_its_subtrees_figures_per_gpu_type(tmp_path):
    from tests.test_usage import TYPED_JOBS, TYPED_QUOTAS

    data = yaml.safe_load(TYPED_QUOTAS)
    data["queues"][0]["cohorts"] = [{"name": "ml"}]
    data["queues"][0]["quotas"][0]["cohort"] = "ml"  # team-a
    with _session(tmp_path) as session:
        seed_into(list(TYPED_JOBS), session=session)
        (ml,) = services.cohorts(parse_quota_file(data), session=session).cohorts
        (page, _) = services.dashboard(parse_quota_file(data), "quotas.yaml", session=session).queues
    assert (ml.subtree_capacity, ml.in_use, ml.borrowed) == (6, 3, 0)
    assert [t.model_dump() for t in ml.types] == [
        {"name": "h100", "subtree_capacity": 2, "in_use": 3, "borrowed": 1, "lent": 0},
        {"name": "a100", "subtree_capacity": 4, "in_use": 0, "borrowed": 0, "lent": 0},
    ]
    (box,) = page.cohorts  # the quota page's
    assert [(t.name, t.capacity, t.in_use, t.borrowed) for t in box.types] == [("h100", 2, 3, 1), ("a100", 4, 0, 0)]
