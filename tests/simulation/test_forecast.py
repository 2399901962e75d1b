"""Estimated start times: the replay engine run forward from a live state (``forecast``)."""

from __future__ import annotations

import copy
import random

import pytest

from airflow_quota_provider.simulation.engine import QUIET_DECIDE, Simulator
from airflow_quota_provider.simulation.forecast import HORIZON_S, describe_start, estimate_starts
from airflow_quota_provider.simulation.policies import policy_setup
from tests.policy.builders import StateBuilder
from tests.simulation.builders import job, quota_file

NOW = 1000.0


def exact(state, now=NOW, **kwargs):
    """Estimates without the grid, so that the tables read exact times."""
    return estimate_starts(state, now, resolution_s=0.0, **kwargs)


def two(**rules):
    """Queue of 8 GPUs: quotas a and b of 4 each, lending and borrowing, grace 30 s."""
    return (
        StateBuilder(8)
        .quota("a", 4, sharing="lend_and_borrow", grace_period_s=30.0, **rules)
        .quota("b", 4, sharing="lend_and_borrow", grace_period_s=30.0, **rules)
    )


CASES = [
    pytest.param(two().wait("w", "a", 4, expected_runtime_s=60.0), {"w": NOW}, id="room now: starts now"),
    pytest.param(
        two().run("r", "a", 8, started_at=900.0, expected_runtime_s=400.0).wait("w", "a", 4, submitted_at=950.0),
        {"w": 1300.0},
        id="waits for the running job's expected end",
    ),
    pytest.param(
        two().run("r", "a", 8, started_at=900.0).wait("w", "a", 4, submitted_at=950.0),
        {"w": None},
        id="a running job of unknown runtime: no estimate, not a made-up one",
    ),
    pytest.param(
        two().run("r", "a", 8, started_at=100.0, expected_runtime_s=400.0).wait("w", "a", 4, submitted_at=950.0),
        {"w": NOW},
        id="a running job past its expected end is expected to end now",
    ),
    pytest.param(
        two()
        .run("r", "a", 8, started_at=900.0, expected_runtime_s=200.0)
        .wait("w1", "a", 8, submitted_at=950.0, expected_runtime_s=500.0)
        .wait("w2", "a", 8, submitted_at=960.0, expected_runtime_s=10.0),
        {"w1": 1100.0, "w2": 1600.0},
        id="queue order: the second waits for the first's expected runtime",
    ),
    pytest.param(
        two()
        .run("r", "a", 8, started_at=900.0, expected_runtime_s=200.0)
        .wait("w1", "a", 8, submitted_at=950.0)
        .wait("w2", "a", 8, submitted_at=960.0, expected_runtime_s=10.0),
        {"w1": 1100.0, "w2": None},
        id="a waiting job of unknown runtime gets its estimate, the jobs behind it none",
    ),
    pytest.param(
        two()
        .run("r", "a", 8, started_at=900.0, expected_runtime_s=200.0)
        .wait("lo", "a", 8, 1, submitted_at=900.0, expected_runtime_s=50.0)
        .wait("hi", "a", 8, 9, submitted_at=990.0, expected_runtime_s=50.0),
        {"hi": 1100.0, "lo": 1150.0},
        id="a higher priority waiting job goes first",
    ),
    pytest.param(
        two(within_quota="lower_priority", reclaim="any")
        .run("borrower", "b", 8, started_at=500.0, expected_runtime_s=5000.0)
        .wait("owner", "a", 4, 5, submitted_at=990.0, expected_runtime_s=100.0),
        {"owner": NOW + 30.0},
        id="reclaim: starts once its victim's grace period ends",
    ),
    pytest.param(
        two(within_quota="lower_priority", reclaim="any")
        .run("victim", "a", 4, 1, started_at=500.0, expected_runtime_s=5000.0, preempted_for="x")
        .run("other", "b", 4, started_at=500.0, expected_runtime_s=50000.0)
        .wait("x", "a", 4, 9, submitted_at=990.0, expected_runtime_s=100.0),
        {"x": NOW + 30.0},
        id="a victim still stopping frees its GPUs within one grace period",
    ),
    pytest.param(
        two().run("r", "a", 8, started_at=900.0, expected_runtime_s=HORIZON_S * 2).wait("w", "a", 4),
        {"w": None},
        id="past the horizon: unknown",
    ),
    pytest.param(
        two().wait("huge", "a", 9, expected_runtime_s=1.0),
        {"huge": None},
        id="a job that can never run (rejected) has no estimate",
    ),
]


@pytest.mark.parametrize(("builder", "want"), CASES)
def test_estimated_starts(builder, want):
    state = builder.build()
    before = copy.deepcopy(state)
    assert exact(state) == want
    assert state == before  # the input is never changed


def test_grid_rounds_up_by_at_most_the_relative_error():
    state = two().run("r", "a", 8, started_at=NOW, expected_runtime_s=10_000.0).wait("w", "a", 4).build()
    estimate = estimate_starts(state, NOW, resolution_s=30.0, relative=0.05)["w"]
    assert NOW + 10_000.0 <= estimate <= NOW + 10_000.0 * 1.05
    near = two().run("r", "a", 8, started_at=NOW, expected_runtime_s=70.0).wait("w", "a", 4).build()
    assert estimate_starts(near, NOW, resolution_s=30.0, relative=0.05)["w"] == NOW + 90.0  # 30-s steps near now


@pytest.mark.parametrize(
    ("estimate", "text"),
    [
        pytest.param(NOW + 12 * 60 + 10, "expected to start in about 12 min", id="minutes"),
        pytest.param(NOW + 20, "expected to start within a minute", id="under a minute"),
        pytest.param(NOW + 3 * 3600 + 600, "expected to start in about 3 h", id="hours"),
        pytest.param(NOW + 2 * 86400, "expected to start in about 2 days", id="days"),
        pytest.param(None, "start time unknown", id="unknown says so"),
    ],
)
def test_describe_start(estimate, text):
    assert describe_start(estimate, NOW).startswith(text)


def test_estimates_match_what_then_happened_in_a_replay():
    """With exact runtimes and no arrivals after the snapshot, the forecast is the replay: every
    estimate made mid-run is the start the replay then gave the job (preemptions included)."""
    rng = random.Random(7)
    teams = ("a", "b")
    jobs = [job(f"j{i}", rng.choice(teams), rng.uniform(0, 50), rng.uniform(10, 400), rng.choice((1, 2, 4)),
                rng.choice((1, 5, 9))) for i in range(120)]
    config = quota_file({"queues": [{"name": "pool", "capacity": 8, "quotas": [
        {"name": name, "capacity": 4, "sharing": "lend_and_borrow", "grace_period_s": 20.0,
         "preemption": {"within_quota": "lower_priority", "reclaim": "any"}} for name in teams]}]})
    snapshots = []

    def decide_and_forecast(state, now):
        # Every job has arrived and the queue is long; no victim is stopping (the forecast cannot
        # know since when, and counts a whole grace period from now).
        if 60.0 <= now and not snapshots and not any(j.preempted_for for j in state.running):
            snapshots.append((now, exact(state, now)))
        return QUIET_DECIDE(state, now)

    result = Simulator(config, policy_setup(config, "quota"), jobs, checkpoint_interval_s=0, decide=decide_and_forecast,
                       runtime_noise=0.0).run()
    ((at, estimates),) = snapshots
    assert len(estimates) > 50 and sum(j.preemptions for j in result.jobs) > 0
    started = {}  # each job's first start from the snapshot on (some were preempted before it)
    for hold in sorted(result.holds, key=lambda hold: hold.start):
        if hold.start >= at:
            started.setdefault(hold.job, hold.start)
    assert estimates == {job_id: started[job_id] for job_id in estimates}


def test_a_typed_queue_and_a_gang_are_forecast_with_their_type_and_hosts():
    """The forecast decides as the executor does: on a typed queue each admission gets its type, and
    a gang its nodes' hosts; jobs waiting behind them get estimates from their ends."""
    from airflow_quota_provider.policy import Host, Job, State
    from airflow_quota_provider.policy.config import parse_quota_file

    q = parse_quota_file({"queues": [{"name": "q", "capacity": {"h100": 8, "a100": 4}, "quotas": [
        {"name": "a", "capacity": {"h100": 8, "a100": 4}, "sharing": "reserve"}]}]}).queues[0]
    hosts = [Host("h-1", 4, type="h100"), Host("h-2", 4, type="h100"), Host("a-1", 4, type="a100")]
    running = [Job(id="r", quota="a", gpus=4, priority=1, submitted_at=0, started_at=NOW - 10, expected_runtime_s=110,
                   host="a-1", gpu_type="a100")]
    pending = [Job(id="gang", quota="a", gpus=8, nodes=2, priority=5, submitted_at=1, expected_runtime_s=500, gpu_types=("h100",)),
               Job(id="next", quota="a", gpus=4, priority=1, submitted_at=2, expected_runtime_s=50, gpu_types=("h100", "a100")),
               Job(id="after", quota="a", gpus=4, priority=1, submitted_at=3, expected_runtime_s=50, gpu_types=("h100",))]
    starts = exact(State.for_queue(q, running, pending, hosts))
    # The gang takes both h100 hosts now; next waits for the a100 job (ends at 1100); after for the gang.
    assert starts == {"gang": NOW, "next": 1100.0, "after": 1500.0}
