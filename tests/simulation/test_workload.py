"""Trace files, day windows, priority classes and Kueue's baseline shape."""

from __future__ import annotations

import pytest

from airflow_quota_provider.simulation.workload import (
    InputError,
    assign_priorities,
    kueue_baseline,
    load_trace,
    parse_priority_classes,
    select_days,
    write_trace,
)
from tests.simulation.builders import job


def write(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text)
    return path


def test_trace_with_optional_columns_round_trips(tmp_path):
    jobs = [job("x", "t1", 5, 60, 2, priority=7, checkpoint=30), job("y", "t2", 0, 1.5, 1, priority=None)]
    path = tmp_path / "t.csv"
    write_trace(jobs, path)
    assert load_trace(path) == jobs


def test_written_times_read_back_exactly(tmp_path):
    # Two months of trace run past 10^6 s; Kueue's shape creates jobs every 0.1 s.
    jobs = [job("late", "t1", 1768017, 13423, 8), job("tenth", "t2", 0.1 * 3, 0.2, 1, checkpoint=1234567.5)]
    path = tmp_path / "t.csv"
    write_trace(jobs, path)
    assert load_trace(path) == jobs
    assert path.read_text().splitlines()[1].startswith("late,t1,1768017,13423,8,")


def test_itp_style_trace_without_optional_columns(tmp_path):
    path = write(tmp_path, "job_id,team,submit_time_s,duration_s,gpus\nj1,itp07,1999,13423,1\n")
    [loaded] = load_trace(path)
    assert (loaded.id, loaded.team, loaded.submit_time_s, loaded.gpus, loaded.priority) == ("j1", "itp07", 1999, 1, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("job_id,team,submit_time_s,gpus\n", "missing column(s) duration_s", id="missing column"),
        pytest.param("job_id,team,submit_time_s,duration_s,gpus,colour\n", "unknown column(s) colour",
                     id="unknown column"),
        pytest.param("job_id,team,submit_time_s,duration_s,gpus\nj,t,0,10,two\n", "t.csv:2: gpus: 'two' is not an integer",
                     id="gpus not a number"),
        pytest.param("job_id,team,submit_time_s,duration_s,gpus\nj,t,0,0,1\n", "duration_s: '0' must be above 0",
                     id="zero duration"),
        pytest.param("job_id,team,submit_time_s,duration_s,gpus\nj,t,0,5,1\nj,t,1,5,1\n",
                     "t.csv:3: job_id: duplicate 'j' (also on line 2)", id="duplicate id"),
        pytest.param("job_id,team,submit_time_s,duration_s,gpus\nj,t,0,5\n", "4 cells, the header has 5",
                     id="short row"),
        pytest.param("", "empty file", id="empty file"),
    ],
)
def test_bad_trace_names_line_and_column(tmp_path, text, message):
    with pytest.raises(InputError, match=None) as error:
        load_trace(write(tmp_path, text))
    assert message in str(error.value)


def test_missing_trace_file_names_the_argument(tmp_path):
    with pytest.raises(InputError) as error:
        load_trace(tmp_path / "nope.csv")
    assert str(error.value).startswith("--trace: cannot read")


def test_day_window_is_half_open():
    jobs = [job("a", "t", 0, 1, 1), job("b", "t", 86_400, 1, 1), job("c", "t", 2 * 86_400 - 1, 1, 1)]
    assert [j.id for j in select_days(jobs, 1, 2)] == ["b", "c"]
    assert [j.id for j in select_days(jobs, None, 1)] == ["a"]
    with pytest.raises(InputError, match="--to-day: 1 must be after --from-day 1"):
        select_days(jobs, 1, 1)
    with pytest.raises(InputError, match="no job is submitted"):
        select_days(jobs, 5, 6)


def test_priority_classes_parse_and_validate():
    classes = parse_priority_classes("high=0.2:100,normal=0.8:10")
    assert [(c.name, c.share, c.priority) for c in classes] == [("high", 0.2, 100), ("normal", 0.8, 10)]
    for bad, message in [("high=0.2", "not name=share:priority"), ("high=x:1,low=0.5:0", "share 'x' is not a number"),
                         ("high=0.5:1,low=0.4:0", "shares sum to 0.9"), ("a=0.5:1,a=0.5:2", "duplicate class name"),
                         ("a=1:p", "priority 'p' is not an integer")]:
        with pytest.raises(InputError) as error:
            parse_priority_classes(bad)
        assert str(error.value).startswith("--priority-classes: ") and message in str(error.value)


def test_priority_draw_is_reproducible_and_keeps_given_priorities():
    jobs = [job(f"j{i}", "t", i, 1, 1, priority=None) for i in range(2000)]
    jobs[3] = job("j3", "t", 3, 1, 1, priority=55)
    classes = parse_priority_classes("high=0.2:100,normal=0.8:10")
    first, names = assign_priorities(jobs, classes, seed=1)
    again, _ = assign_priorities(jobs, classes, seed=1)
    other, _ = assign_priorities(jobs, classes, seed=2)
    assert first == again and first != other
    assert first[3].priority == 55 and "j3" not in names
    high = sum(1 for j in first if j.priority == 100)
    assert 330 <= high <= 470  # 20 % of 2,000, within about 3.5 standard deviations
    unassigned, _ = assign_priorities(jobs, None, seed=1)
    assert {j.priority for j in unassigned} == {0, 55}


def test_kueue_baseline_shape():
    quotas, jobs = kueue_baseline()
    assert [len(q.quotas) for q in quotas.queues] == [6] * 5
    assert {q.capacity for queue in quotas.queues for q in queue.quotas} == {20}
    assert all(q.capacity == 120 for q in quotas.queues)
    assert len(jobs) == 30 * 500
    per_quota = [j for j in jobs if j.team == "cq-0-0"]
    by_class = {c: [j for j in per_quota if j.size_class == c] for c in ("small", "medium", "large")}
    assert {c: (len(v), v[0].gpus, v[0].duration_s) for c, v in by_class.items()} == {
        "small": (350, 1, 0.2), "medium": (100, 5, 0.5), "large": (50, 20, 1.0)}
    assert sum(j.gpus * j.duration_s for j in per_quota) == pytest.approx(1320)
    # Kueue's generator waits one interval before each creation, the first one included
    assert [j.submit_time_s for j in by_class["small"][:2]] == pytest.approx([0.1, 0.2])
    assert max(j.submit_time_s for j in by_class["large"]) == pytest.approx(60.0)


def test_itp_example_quota_file_covers_the_ten_source_clusters():
    from pathlib import Path

    from airflow_quota_provider.policy import load_quota_file

    quota_file = load_quota_file(Path(__file__).resolve().parents[2] / "examples" / "itp-quotas.yaml")
    [queue] = quota_file.queues
    assert queue.capacity == 1200 == sum(q.capacity for q in queue.quotas)
    assert [quota_file.quota_for_team(f"itp{i:02d}") for i in range(1, 11)] == [f"itp{i:02d}" for i in range(1, 11)]
    assert {(q.sharing, q.grace_period_s, q.preemption.reclaim) for q in queue.quotas} == {("lend_and_borrow", 120.0, "any")}
