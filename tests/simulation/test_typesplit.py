"""``--types``: an untyped quota file and trace replayed as a fleet of several GPU types."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from airflow_quota_provider.policy import load_quota_file
from airflow_quota_provider.simulation.cli import main
from airflow_quota_provider.simulation.runner import simulate
from airflow_quota_provider.simulation.typesplit import draw_gpu_types, parse_type_shares, split_types
from airflow_quota_provider.simulation.workload import InputError, load_trace, write_trace
from tests.simulation.builders import job, quota_file, two_quotas, write_files

SHARES = {"h100": 0.25, "a100": 0.5, "l4": 0.25}
ITP = "examples/itp-quotas.yaml"


def test_every_quotas_parts_add_up_to_its_capacity_and_no_type_is_overcommitted():
    itp = load_quota_file(ITP)
    typed = split_types(itp, SHARES)
    queue, original = typed.queues[0], itp.queues[0]
    assert [t.name for t in queue.types] == ["h100", "a100", "l4"]
    assert [t.capacity for t in queue.types] == [300, 600, 300]
    for quota in original.quotas:
        assert sum(t.quota(quota.name).capacity for t in queue.types) == quota.capacity, quota.name
        assert queue.quota(quota.name).capacity == quota.capacity
    for gpu_type in queue.types:
        assert sum(q.capacity for q in gpu_type.quotas) <= gpu_type.capacity


def test_on_hosts_each_type_gets_whole_hosts():
    typed = split_types(load_quota_file(ITP), SHARES, gpus_per_host=8)
    assert [t.capacity for t in typed.queues[0].types] == [304, 600, 296]  # 38, 75 and 37 hosts of 8: a tie goes to the preferred type


def test_limits_are_split_and_a_lend_limit_never_exceeds_a_types_part():
    data = two_quotas(capacity=10, each=5)
    data["queues"][0]["quotas"][0].update(lend_limit=3, borrow_limit=4)
    typed = split_types(quota_file(data), {"x": 0.5, "y": 0.5})
    x, y = typed.queues[0].types
    a_x, a_y = x.quota("a"), y.quota("a")
    assert (a_x.capacity + a_y.capacity, a_x.lend_limit + a_y.lend_limit, a_x.borrow_limit + a_y.borrow_limit) == (5, 3, 4)
    assert a_x.lend_limit <= a_x.capacity and a_y.lend_limit <= a_y.capacity


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("h100", "'h100': expected NAME=SHARE"),
        ("h100=0.5,h100=0.5", "GPU type 'h100' given twice"),
        ("h100=0.5,a100=0.4", "shares add up to 0.9; they must add up to 1"),
        ("h100=1.5", "h100: share '1.5' is not a number above 0 and at most 1"),
        ("a=0.1,b=0.1,c=0.2,d=0.2,e=0.2,f=0.2", "6 GPU types; at most 5"),
    ],
)
def test_bad_shares_name_the_flag_and_what_is_allowed(text, message):
    with pytest.raises(InputError, match="^--types: " + message.replace("(", r"\(").replace(")", r"\)")):
        parse_type_shares(text)


def test_a_type_without_a_gpu_is_refused_naming_it():
    with pytest.raises(InputError, match="GPU type l4 gets no GPUs of job queue pool"):
        split_types(quota_file(two_quotas(capacity=8)), {"h100": 0.95, "l4": 0.05}, gpus_per_host=4)


def test_a_jobs_drawn_type_does_not_depend_on_the_other_jobs_and_a_traced_type_is_kept(tmp_path):
    jobs = [job(f"j{n}", "a", n, 10, 1) for n in range(200)]
    drawn = draw_gpu_types(jobs, SHARES, seed=1)
    assert {j.gpu_types for j in drawn} == {("h100",), ("a100",), ("l4",)}
    traced = [replace(jobs[0], gpu_types=("l4", "h100")), *jobs[1:]]
    again = draw_gpu_types(traced, SHARES, seed=1)
    assert again[0].gpu_types == ("l4", "h100")
    assert [j.gpu_types for j in again[1:]] == [j.gpu_types for j in drawn[1:]]
    write_trace(again[:3], tmp_path / "t.csv")  # the trace column: names in order, '|' between
    assert [j.gpu_types for j in load_trace(tmp_path / "t.csv")] == [j.gpu_types for j in again[:3]]


def test_a_typed_replay_on_hosts_keeps_every_job_on_its_types_hosts(tmp_path):
    """The engine checks each admission against its type's capacity and its host's type; a 4-GPU job
    drawn for a type whose hosts are all busy waits though other types are idle."""
    jobs = [job(f"a{n}", "a", n, 100, 4) for n in range(6)] + [job(f"b{n}", "b", n, 50, 2) for n in range(6)]
    trace, config = write_files(tmp_path, jobs, two_quotas(capacity=16, each=8))
    out = tmp_path / "o.json"
    assert main(["run", "--trace", str(trace), "--config", str(config), "--policy", "all", "--types", "x=0.5,y=0.5",
                 "--hosts-per-queue", "4", "--gpus-per-host", "4", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["workload"]["types"] == "x=0.5,y=0.5"
    for policy in ("quota", "static", "fifo"):
        assert report["policies"][policy]["checks"]["conservation"] == "passed"
        assert report["policies"][policy]["overall"]["completed"] == 12, policy
    typed = split_types(quota_file(two_quotas(capacity=16, each=8)), {"x": 0.5, "y": 0.5}, gpus_per_host=4)
    run = simulate(typed, draw_gpu_types(jobs, {"x": 0.5, "y": 0.5}, seed=1), ["quota"], hosts_per_queue=4, gpus_per_host=4)
    untyped = simulate(quota_file(two_quotas(capacity=16, each=8)), jobs, ["quota"], hosts_per_queue=4, gpus_per_host=4)
    assert run.report["policies"]["quota"]["overall"]["wait_mean_s"] > untyped.report["policies"]["quota"]["overall"]["wait_mean_s"]


def test_a_trace_cell_with_an_empty_type_name_is_named(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,team,submit_time_s,duration_s,gpus,gpu_type\nj1,a,0,10,1,h100||l4\n")
    with pytest.raises(InputError, match=r"t.csv:2: gpu_type: 'h100\|\|l4' has an empty name"):
        load_trace(trace)
