"""Exact figures for hand-made traces, under the three policies, all decided by ``policy.decide``."""

from __future__ import annotations

import json

import pytest

from airflow_quota_provider.policy import Host, decide
from airflow_quota_provider.simulation.runner import simulate
from airflow_quota_provider.simulation.workload import InputError, kueue_baseline
from tests.simulation.builders import RECLAIM_JOBS, job, quota_file, two_quotas

H = 3600.0


def figures(report, policy, scope="overall"):
    block = report["policies"][policy]
    return block["overall"] if scope == "overall" else block["quotas"][scope]


def test_borrow_then_reclaim_exact_figures():
    run = simulate(quota_file(two_quotas()), RECLAIM_JOBS, ["quota"], checkpoint_interval_s=100)
    report = run.report
    a = figures(report, "quota", "a")
    b = figures(report, "quota", "b")
    overall = figures(report, "quota")
    assert a == {
        "jobs": 1, "gpu_hours": round(400 / H, 6), "utilisation": round(400 / (4 * 1180), 6),
        "wait_mean_s": 30.0, "wait_p50_s": 30.0, "wait_p95_s": 30.0, "wait_p99_s": 30.0,
        "in_quota_wait_p95_s": 30.0, "borrowed_gpu_hours": 0.0, "preemptions": 0, "lost_gpu_hours": 0.0,
        "reclaim_latency_p95_s": 30.0, "makespan_s": 380.0,
        "completed": 1, "rejected": 0, "failed": 0, "in_quota_jobs": 1, "reclaim_jobs": 1, "capacity": 4,
        # a's 4 GPUs over 1180 s: 400 used by a1, the rest held by b's borrowing b1 (lent).
        "used_within_gpu_hours": round(400 / H, 6), "lent_gpu_hours": round(4320 / H, 6), "idle_gpu_hours": 0.0,
    }
    assert b == {
        "jobs": 1, "gpu_hours": round(8000 / H, 6), "utilisation": round(4320 / (4 * 1180), 6),
        "wait_mean_s": 100.0, "wait_p50_s": 100.0, "wait_p95_s": 100.0, "wait_p99_s": 100.0,
        "in_quota_wait_p95_s": None, "borrowed_gpu_hours": 1.2, "preemptions": 1,
        "lost_gpu_hours": round(640 / H, 6), "reclaim_latency_p95_s": None, "makespan_s": 1180.0,
        "completed": 1, "rejected": 0, "failed": 0, "in_quota_jobs": 0, "reclaim_jobs": 0, "capacity": 4,
        "used_within_gpu_hours": round(4320 / H, 6), "lent_gpu_hours": 0.0, "idle_gpu_hours": round(400 / H, 6),
    }
    assert overall == {
        "jobs": 2, "gpu_hours": round(8400 / H, 6), "utilisation": round(9040 / (8 * 1180), 6),
        "wait_mean_s": 65.0, "wait_p50_s": 30.0, "wait_p95_s": 100.0, "wait_p99_s": 100.0,
        "in_quota_wait_p95_s": 30.0, "borrowed_gpu_hours": 1.2, "preemptions": 1,
        "lost_gpu_hours": round(640 / H, 6), "reclaim_latency_p95_s": 30.0, "makespan_s": 1180.0,
        "completed": 2, "rejected": 0, "failed": 0, "in_quota_jobs": 1, "reclaim_jobs": 1, "capacity": 8,
    }
    assert report["policies"]["quota"]["checks"] == {"conservation": "passed", "zero_wait_queues": []}


def test_static_rejects_what_exceeds_a_reserved_quota_and_never_preempts():
    run = simulate(quota_file(two_quotas()), RECLAIM_JOBS, ["static"], checkpoint_interval_s=100)
    a = figures(run.report, "static", "a")
    b = figures(run.report, "static", "b")
    # b1 asks for 8 GPUs of a 4-GPU quota that may not borrow: it can never run.
    assert (b["jobs"], b["rejected"], b["gpu_hours"], b["wait_mean_s"], b["makespan_s"]) == (1, 1, 0.0, None, 0.0)
    assert (a["wait_mean_s"], a["reclaim_jobs"], a["reclaim_latency_p95_s"], a["preemptions"]) == (0.0, 0, None, 0)
    assert a["makespan_s"] == 350.0  # 250 + 100: a's own capacity was free
    assert a["utilisation"] == round(400 / (4 * 350), 6)


def test_fifo_runs_in_submit_order_and_reports_against_the_nominal_quotas():
    run = simulate(quota_file(two_quotas()), RECLAIM_JOBS, ["fifo"], checkpoint_interval_s=100)
    a = figures(run.report, "fifo", "a")
    b = figures(run.report, "fifo", "b")
    # No preemption: a1 waits for b1 to finish at 1000 although a's nominal capacity was lent.
    assert (a["wait_mean_s"], a["in_quota_jobs"], a["reclaim_latency_p95_s"], a["makespan_s"]) == (750.0, 1, 750.0, 1100.0)
    assert (b["preemptions"], b["lost_gpu_hours"], b["borrowed_gpu_hours"]) == (0, 0.0, round(4 * 1000 / H, 6))
    assert figures(run.report, "fifo")["utilisation"] == round((8000 + 400) / (8 * 1100), 6)


def test_preemption_past_the_limit_fails_the_job_with_its_saved_work_counted():
    run = simulate(quota_file(two_quotas(max_preemptions=0)), RECLAIM_JOBS, ["quota"], checkpoint_interval_s=100)
    b = figures(run.report, "quota", "b")
    assert (b["failed"], b["completed"], b["preemptions"]) == (1, 0, 1)
    assert b["gpu_hours"] == round((2240 - 640) / H, 6)  # held 280 s x 8, lost 80 s x 8
    assert b["lost_gpu_hours"] == round(640 / H, 6)
    assert b["makespan_s"] == 280.0


@pytest.mark.parametrize(
    ("checkpoint", "lost_s"),
    [pytest.param(0, 280, id="no checkpoints: the whole attempt is lost"),
     pytest.param(90, 10, id="checkpoints at 90,180,270: 10 s lost"),
     pytest.param(1000, 280, id="no checkpoint reached yet")],
)
def test_lost_work_is_the_run_time_since_the_last_checkpoint(checkpoint, lost_s):
    jobs = [job("b1", "b", 0, 1000, 8, checkpoint=checkpoint), job("a1", "a", 250, 100, 4)]
    run = simulate(quota_file(two_quotas()), jobs, ["quota"], checkpoint_interval_s=100)
    b = figures(run.report, "quota", "b")
    assert b["lost_gpu_hours"] == round(lost_s * 8 / H, 6)
    # It restarts at 380 with the unsaved work still to do.
    assert b["makespan_s"] == 380 + 1000 - (280 - lost_s)


def test_grace_period_decides_reclaim_latency():
    run = simulate(quota_file(two_quotas(grace=0)), RECLAIM_JOBS, ["quota"], checkpoint_interval_s=100)
    a = figures(run.report, "quota", "a")
    assert (a["reclaim_latency_p95_s"], a["wait_mean_s"]) == (0.0, 0.0)


def test_priority_preemption_within_a_quota_and_requeue_at_the_original_submit_time():
    # One quota of 4: low1 runs; high arrives and preempts it; low2 (submitted after low1) must not
    # overtake the requeued low1, which keeps its original submit time.
    data = {"queues": [{"name": "pool", "capacity": 4, "quotas": [
        {"name": "a", "capacity": 4, "grace_period_s": 10, "preemption": {"within_quota": "lower_priority"}}]}]}
    jobs = [job("low1", "a", 0, 100, 4, priority=1), job("low2", "a", 5, 100, 4, priority=1),
            job("high", "a", 50, 100, 4, priority=9)]
    run = simulate(quota_file(data), jobs, ["quota"], checkpoint_interval_s=0)
    result = run.results["quota"]
    by_id = {j.trace.id: j for j in result.jobs}
    assert (by_id["high"].first_start, by_id["high"].end) == (60.0, 160.0)
    assert (by_id["low1"].preemptions, by_id["low1"].end) == (1, 260.0)  # lost all 60 s, reran 160-260
    assert (by_id["low2"].first_start, by_id["low2"].end) == (260.0, 360.0)
    assert run.report["policies"]["quota"]["by_priority"]["9"]["wait_mean_s"] == 10.0


def test_enough_capacity_means_no_wait_under_every_policy():
    jobs = [job(f"j{i}", "ab"[i % 2], i * 10, 55, 1 + i % 3) for i in range(12)]
    run = simulate(quota_file(two_quotas(capacity=20, each=10)), jobs, checkpoint_interval_s=0)
    for policy in ("quota", "static", "fifo"):
        overall = figures(run.report, policy)
        assert (overall["wait_p99_s"], overall["preemptions"]) == (0.0, 0)
        assert run.report["policies"][policy]["checks"]["zero_wait_queues"] == ["pool"]


def test_same_trace_twice_gives_identical_json():
    quotas, jobs = kueue_baseline(groups=1, quotas_per_group=2)
    jobs = [j for j in jobs if j.submit_time_s < 8]
    first = simulate(quotas, jobs)
    second = simulate(quotas, list(jobs))
    assert json.dumps(first.report, sort_keys=True) == json.dumps(second.report, sort_keys=True)
    assert first.report["policies"]["quota"]["overall"]["jobs"] == len(jobs)


def test_decide_sees_stopping_victims_and_their_checkpoints():
    seen = []

    def recording(state, now):
        seen.append((now, {j.id: (j.started_at, j.last_checkpoint_at, j.preempted_for) for j in state.running}))
        return decide(state, now)

    simulate(quota_file(two_quotas()), RECLAIM_JOBS, ["quota"], checkpoint_interval_s=100, decide=recording)
    at_250 = dict(seen)[250.0]
    assert at_250 == {"b1": (0.0, 200.0, None)}  # last checkpoint at 200, not yet chosen
    times = [now for now, _ in seen]
    assert times == sorted(times) and 280.0 in times  # asked again when the victim stopped


@pytest.mark.parametrize(
    ("rule", "high_starts"),
    [pytest.param({"min_runtime_s": 100}, 100.0, id="victim protected until its min_runtime_s"),
     pytest.param({"preemption_delay_s": 50}, 60.0, id="preemptor waits its preemption_delay_s"),
     pytest.param({}, 10.0, id="no timers: preempted at once")],
)
def test_time_based_rules_wake_the_policy_though_nothing_else_happens(rule, high_starts):
    data = {"queues": [{"name": "pool", "capacity": 4, "quotas": [
        {"name": "a", "capacity": 4, "grace_period_s": 0, **rule}]}]}
    jobs = [job("low", "a", 0, 1000, 4, priority=1), job("high", "a", 10, 5, 4, priority=9)]
    run = simulate(quota_file(data), jobs, ["quota"], checkpoint_interval_s=0)
    by_id = {j.trace.id: j for j in run.results["quota"].jobs}
    assert by_id["high"].first_start == high_starts
    assert by_id["low"].preemptions == 1


# Two quotas of 4 on two hosts of 4: j1 and j2 take 3 GPUs of each host. j3's 2 GPUs fit the pool
# (2 free) and quota b (it borrows 1 of a's idle GPU), but no host until j1 ends at 100.
FRAGMENTING_JOBS = [job("j1", "a", 0, 100, 3), job("j2", "b", 0, 200, 3), job("j3", "b", 10, 50, 2)]


def test_hosts_show_what_fragmentation_costs():
    pooled = simulate(quota_file(two_quotas()), FRAGMENTING_JOBS, ["quota"], checkpoint_interval_s=0)
    placed = simulate(quota_file(two_quotas()), FRAGMENTING_JOBS, ["quota"], checkpoint_interval_s=0,
                      hosts_per_queue=2, gpus_per_host=4)
    waits = {name: {j.trace.id: j.wait for j in run.results["quota"].jobs} for name, run in (("pooled", pooled), ("placed", placed))}
    assert waits == {"pooled": {"j1": 0.0, "j2": 0.0, "j3": 0.0}, "placed": {"j1": 0.0, "j2": 0.0, "j3": 90.0}}
    assert placed.report["workload"]["hosts_per_queue"] == 2 and placed.report["workload"]["gpus_per_host"] == 4
    assert "hosts_per_queue" not in pooled.report["workload"]
    assert placed.report["policies"]["quota"]["checks"] == {"conservation": "passed", "zero_wait_queues": []}


def test_decide_sees_the_hosts_and_each_running_jobs_host():
    seen = []

    def recording(state, now):
        seen.append((now, state.hosts, {j.id: j.host for j in state.running}))
        return decide(state, now)

    simulate(quota_file(two_quotas()), FRAGMENTING_JOBS, ["quota"], checkpoint_interval_s=0, decide=recording,
             hosts_per_queue=2, gpus_per_host=4)
    hosts = (Host("pool-1", 4), Host("pool-2", 4))
    assert seen[0] == (0.0, hosts, {})
    assert dict((now, running) for now, _, running in seen)[100.0] == {"j2": "pool-2"}  # j1 ended; j3 goes to pool-1


def test_jobs_larger_than_a_host_run_as_gangs_and_those_no_hosts_can_hold_are_rejected_and_counted():
    jobs = [job("big", "a", 0, 100, 8), job("odd", "b", 0, 100, 7)]
    run = simulate(quota_file(two_quotas()), jobs, ["quota"], checkpoint_interval_s=0, hosts_per_queue=2, gpus_per_host=4)
    overall = figures(run.report, "quota")
    assert (overall["rejected"], overall["rejected_larger_than_host"], overall["completed"]) == (1, 1, 1)
    big, odd = sorted(run.results["quota"].jobs, key=lambda j: j.trace.id)
    assert (big.job.nodes, big.first_start, big.end) == (2, 0, 100)
    # 7 GPUs split evenly only into 7 nodes of 1, and the queue has 2 hosts
    assert odd.message == "asks for 7 hosts with 1 GPU each; this job queue has 2 hosts of at least 1 GPU"


def test_one_host_of_the_queue_capacity_replays_as_no_hosts():
    pooled = simulate(quota_file(two_quotas()), RECLAIM_JOBS, checkpoint_interval_s=100)
    placed = simulate(quota_file(two_quotas()), RECLAIM_JOBS, checkpoint_interval_s=100, hosts_per_queue=1, gpus_per_host=8)
    for policy in ("quota", "static", "fifo"):
        got = dict(figures(placed.report, policy))
        assert (got.pop("rejected_larger_than_host"), got.pop("gang_jobs"), got.pop("gang_wait_mean_s")) == (0, 0, None)
        assert got == figures(pooled.report, policy)


@pytest.mark.parametrize(
    ("hosts_per_queue", "gpus_per_host", "message"),
    [
        pytest.param(2, None, "--gpus-per-host: is required with --hosts-per-queue", id="hosts without their size"),
        pytest.param(None, 4, "--hosts-per-queue: is required with --gpus-per-host", id="a size without hosts"),
        pytest.param(3, 4, "--hosts-per-queue: 3 hosts of 4 GPUs are 12 GPUs; job queue pool has 8 (they must be equal)",
                     id="hosts that are not the queue's capacity"),
        pytest.param(0, 4, "--hosts-per-queue: 0 must be at least 1", id="no hosts"),
    ],
)
def test_hosts_are_both_given_or_neither_and_make_each_queues_capacity(hosts_per_queue, gpus_per_host, message):
    with pytest.raises(InputError) as error:
        simulate(quota_file(two_quotas()), RECLAIM_JOBS, hosts_per_queue=hosts_per_queue, gpus_per_host=gpus_per_host)
    assert str(error.value).startswith(message)


def test_cohorts_get_figures_of_their_own_and_a_team_reclaims_its_cohorts_capacity():
    """Team a owns nothing, its cohort ml owns 4: b borrows them from t=0, a1 takes them back at 250
    (grace 30 s), exactly as a quota of its own would (test_borrow_then_reclaim_exact_figures)."""
    config = two_quotas(each=4)
    config["queues"][0]["cohorts"] = [{"name": "ml", "capacity": 4}]
    config["queues"][0]["quotas"][0].update(capacity=0, cohort="ml")
    report = simulate(quota_file(config), RECLAIM_JOBS, ["quota", "static"], checkpoint_interval_s=100).report
    ml = report["policies"]["quota"]["cohorts"]["ml"]
    assert {key: ml[key] for key in ("jobs", "capacity", "utilisation", "borrowed_gpu_hours", "preemptions", "makespan_s")} == {
        "jobs": 1, "capacity": 4, "utilisation": round(400 / (4 * 1180), 6), "borrowed_gpu_hours": 0.0,
        "preemptions": 0, "makespan_s": 380.0,
    }
    assert figures(report, "quota", "b")["preemptions"] == 1
    # Airflow pools have no cohorts: a team without a capacity of its own never runs
    assert figures(report, "static", "a")["rejected"] == 1
    assert report["policies"]["static"]["cohorts"]["ml"]["utilisation"] == 0.0


@pytest.mark.parametrize(("runtime_noise", "preemptions"), [
    pytest.param(None, 1, id="without runtimes the borrower is preempted though it would end within its grace"),
    pytest.param(0.0, 0, id="with exact runtimes the borrower about to finish is waited for"),
])
def test_a_borrower_about_to_finish_is_waited_for_with_runtimes(runtime_noise, preemptions):
    # b1 borrows all 8 GPUs until 1000; a1 arrives at 980 with a 30 s grace period: b1 ends first.
    jobs = [job("b1", "b", 0, 1000, 8), job("a1", "a", 980, 100, 4)]
    run = simulate(quota_file(two_quotas()), jobs, ["quota"], checkpoint_interval_s=100, runtime_noise=runtime_noise)
    overall = figures(run.report, "quota")
    assert overall["preemptions"] == preemptions
    assert figures(run.report, "quota", "a")["wait_mean_s"] == 20.0, "a1 starts when b1 ends, either way"


def test_with_runtimes_the_victim_that_saved_last_loses_least():
    # b1 runs from 0 and saves every 300 s; b2 runs from 100 and saves nothing. a1 reclaims at 350
    # (victims stop at 380): b1 has 80 s to lose, b2, though it started later, 280 s.
    jobs = [job("b1", "b", 0, 5000, 4, checkpoint=300), job("b2", "b", 100, 5000, 4, checkpoint=5000),
            job("a1", "a", 350, 100, 4)]
    lost = {}
    for noise in (None, 0.0):
        run = simulate(quota_file(two_quotas()), jobs, ["quota"], runtime_noise=noise)
        lost[noise] = figures(run.report, "quota", "b")["lost_gpu_hours"]
    assert lost[None] == round(4 * 280 / H, 6), "most recently started: b2, 250 s + the 30 s grace"
    assert lost[0.0] == round(4 * 80 / H, 6), "least lost since its checkpoint: b1, 50 s + 30 s"


def test_kueues_baseline_on_hosts_ends_without_the_policy_going_round_in_circles():
    # Each cohort's large job once preempted on one host while its quota's smaller jobs borrowed on
    # another; with its victims gone it no longer fitted, preempted those in turn, and its first host
    # went to its first victims: 341 decisions at t=3.5 s until the engine's CheckError.
    quota_file, jobs = kueue_baseline(groups=1)
    run = simulate(quota_file, jobs, ["quota"], hosts_per_queue=6, gpus_per_host=20, runtime_noise=0.5)
    assert run.report["policies"]["quota"]["checks"]["conservation"] == "passed"
    assert {job.status for job in run.results["quota"].jobs} == {"completed"}


def test_a_queue_with_gpu_types_replays_each_type_within_its_capacity_under_every_policy():
    """Two types of 4 GPUs: untyped jobs take whichever has room (the engine checks every admission
    against its type's capacity); a 6-GPU job fits no type and is rejected, though 8 GPUs exist, and
    no quota gets around its share of a type."""
    shares = {"capacity": {"h100": 2, "a100": 2}, "sharing": "lend_and_borrow",
              "preemption": {"within_quota": "lower_priority", "reclaim": "any"}, "grace_period_s": 10}
    typed = quota_file({"queues": [{"name": "pool", "capacity": {"h100": 4, "a100": 4},
                                    "quotas": [{"name": "a", **shares}, {"name": "b", **shares}]}]})
    jobs = [job("b1", "b", 0, 500, 4), job("b2", "b", 0, 500, 4), job("a1", "a", 100, 100, 2),
            job("a2", "a", 100, 100, 2), job("big", "a", 150, 10, 6)]
    report = simulate(typed, jobs, ["quota", "static", "fifo"]).report
    # Static: each quota holds its 2 GPUs of a type and never borrows, so b's 4-GPU jobs never fit.
    for policy, completed, rejected in (("quota", 4, 1), ("static", 2, 3), ("fifo", 4, 1)):
        overall = figures(report, policy)
        assert (overall["completed"], overall["rejected"]) == (completed, rejected), (policy, overall)
        assert report["policies"][policy]["checks"]["conservation"] == "passed"
    assert figures(report, "quota")["preemptions"] >= 1, "a reclaims on a type b borrowed"
