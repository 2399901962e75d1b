"""``python -m airflow_quota_provider.simulation`` and ``airflow quota simulate``: output and errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from airflow_quota_provider.cli.simulate_command import SIMULATE_ARGS, simulate as airflow_simulate
from airflow_quota_provider.simulation.cli import main
from tests.simulation.builders import RECLAIM_JOBS, job, two_quotas, write_files


@pytest.fixture
def files(tmp_path):
    return write_files(tmp_path, RECLAIM_JOBS, two_quotas())


def test_run_all_policies_writes_json_and_plot(tmp_path, files, capsys):
    trace, config = files
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    code = main(["run", "--trace", str(trace), "--config", str(config), "--checkpoint-interval", "100",
                 "--json", str(out), "--plot", str(png)])
    assert code == 0
    report = json.loads(out.read_text())
    assert list(report["policies"]) == ["quota", "static", "fifo"]
    for figures in report["policies"].values():
        assert set(figures["overall"]) >= {
            "jobs", "gpu_hours", "utilisation", "wait_mean_s", "wait_p50_s", "wait_p95_s", "wait_p99_s",
            "in_quota_wait_p95_s", "borrowed_gpu_hours", "preemptions", "lost_gpu_hours",
            "reclaim_latency_p95_s", "makespan_s"}
        assert set(figures["quotas"]) == {"a", "b"}
    assert report["policies"]["quota"]["quotas"]["b"]["lost_gpu_hours"] == round(640 / 3600, 6)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("policy") and [line.split()[0] for line in table[1:]] == ["quota", "static", "fifo"]


def test_one_policy_and_a_day_window(tmp_path, capsys):
    jobs = [job("early", "a", 0, 10, 1), job("late", "b", 86_400 * 2 + 5, 10, 1)]
    trace, config = write_files(tmp_path, jobs, two_quotas())
    out = tmp_path / "o.json"
    assert main(["run", "--trace", str(trace), "--config", str(config), "--policy", "static", "--from-day", "1",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["policies"]) == ["static"]
    assert report["policies"]["static"]["overall"]["jobs"] == 1
    assert report["workload"]["from_day"] == 1.0


def test_priority_classes_are_drawn_with_the_seed(tmp_path):
    jobs = [job(f"j{i}", "a", i, 10, 1, priority=None) for i in range(50)]
    trace, config = write_files(tmp_path, jobs, two_quotas())
    reports = []
    for seed in ("1", "1", "2"):
        out = tmp_path / f"{len(reports)}.json"
        assert main(["run", "--trace", str(trace), "--config", str(config), "--policy", "fifo",
                     "--priority-classes", "high=0.2:100,normal=0.8:10", "--seed", seed, "--json", str(out)]) == 0
        reports.append(json.loads(out.read_text())["policies"]["fifo"]["by_priority"])
    assert reports[0] == reports[1] != reports[2]
    assert set(reports[0]) == {"10", "100"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--policy", "best"], "argument --policy: invalid choice: 'best'", id="unknown policy"),
        pytest.param(["--seed", "x"], "argument --seed: invalid int value: 'x'", id="bad seed"),
        pytest.param(["--from-day", "-1"], "argument --from-day: '-1' must be a number of days", id="negative day"),
        pytest.param(["--checkpoint-interval", "soon"], "argument --checkpoint-interval: invalid seconds value",
                     id="bad checkpoint interval"),
    ],
)
def test_bad_arguments_are_named_by_argparse(files, capsys, argv, message):
    trace, config = files
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--trace", str(trace), "--config", str(config), *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_required_argument(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--config", "x.yaml"])
    assert "the following arguments are required: --trace" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"trace": "missing.csv"}, "Error: --trace: cannot read", id="missing trace"),
        pytest.param({"config": "missing.yaml"}, "Error: --config: missing.yaml: cannot read the quota file",
                     id="missing config"),
        pytest.param({"extra": ["--priority-classes", "high=2:1"]}, "Error: --priority-classes: high: share '2'",
                     id="bad priority classes"),
        pytest.param({"extra": ["--json", "/no/such/dir/out.json"]}, "Error: --json: directory of", id="bad json path"),
        pytest.param({"extra": ["--from-day", "3", "--to-day", "2"]}, "Error: --to-day: 2 must be after --from-day 3",
                     id="empty window"),
    ],
)
def test_bad_input_is_one_line_naming_the_argument(tmp_path, files, capsys, change, message):
    trace, config = files
    argv = ["run", "--trace", change.get("trace", str(trace)), "--config", change.get("config", str(config)),
            *change.get("extra", [])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_team_without_a_quota_is_named(tmp_path, capsys):
    trace, config = write_files(tmp_path, [job("x", "zeta", 0, 10, 1)], two_quotas())
    assert main(["run", "--trace", str(trace), "--config", str(config)]) == 2
    assert "Error: --config: no quota for team(s) zeta" in capsys.readouterr().err


def test_bad_quota_file_reports_the_policy_path(tmp_path, capsys):
    data = two_quotas()
    data["queues"][0]["quotas"][0]["sharing"] = "hoard"
    trace, config = write_files(tmp_path, RECLAIM_JOBS, data)
    assert main(["run", "--trace", str(trace), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: --config: queues[0].quotas[0].sharing: 'hoard' is not one of")


def test_teams_map_onto_quotas(tmp_path):
    data = two_quotas()
    data["queues"][0]["quotas"][0]["teams"] = ["vision", "speech"]
    jobs = [job("v", "vision", 0, 10, 1), job("s", "speech", 0, 10, 1), job("b", "b", 0, 10, 1)]
    trace, config = write_files(tmp_path, jobs, data)
    out = tmp_path / "o.json"
    assert main(["run", "--trace", str(trace), "--config", str(config), "--policy", "quota", "--json", str(out)]) == 0
    quotas = json.loads(out.read_text())["policies"]["quota"]["quotas"]
    assert (quotas["a"]["jobs"], quotas["b"]["jobs"]) == (2, 1)


def test_airflow_command_takes_the_same_arguments(files, tmp_path, capsys):
    trace, config = files
    parser = argparse.ArgumentParser()
    for arg in SIMULATE_ARGS:
        arg.add_to_parser(parser)
    out = tmp_path / "a.json"
    airflow_simulate(parser.parse_args(["--trace", str(trace), "--config", str(config), "--json", str(out)]))
    assert json.loads(out.read_text())["policies"]["quota"]["overall"]["jobs"] == 2
    with pytest.raises(SystemExit, match=r"^Error: --trace: cannot read"):
        airflow_simulate(parser.parse_args(["--trace", "nope.csv", "--config", str(config)]))


def test_module_entry_point_and_kueue_shape(tmp_path):
    done = subprocess.run([sys.executable, "-m", "airflow_quota_provider.simulation", "kueue-shape", "--out-dir",
                           str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "kueue-baseline.csv").read_text().count("\n") == 15001
    assert "cq-4-5" in (tmp_path / "kueue-baseline-quotas.yaml").read_text()


def test_run_with_hosts_places_jobs_and_reports_the_fleet(tmp_path):
    jobs = [job("big", "a", 0, 10, 8), job("small", "b", 0, 10, 4)]
    trace, config = write_files(tmp_path, jobs, two_quotas())
    out = tmp_path / "o.json"
    assert main(["run", "--trace", str(trace), "--config", str(config), "--policy", "quota",
                 "--hosts-per-queue", "2", "--gpus-per-host", "4", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["workload"]["hosts_per_queue"], report["workload"]["gpus_per_host"]) == (2, 4)
    overall = report["policies"]["quota"]["overall"]
    assert (overall["rejected"], overall["gang_jobs"], overall["completed"]) == (0, 1, 2)  # big: 2 nodes of 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--hosts-per-queue", "2"], "Error: --gpus-per-host: is required with --hosts-per-queue",
                     id="hosts without their size"),
        pytest.param(["--hosts-per-queue", "4", "--gpus-per-host", "4"],
                     "Error: --hosts-per-queue: 4 hosts of 4 GPUs are 16 GPUs; job queue pool has 8", id="wrong fleet size"),
    ],
)
def test_bad_hosts_are_one_line_naming_the_argument(files, capsys, argv, message):
    trace, config = files
    assert main(["run", "--trace", str(trace), "--config", str(config), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_a_host_count_below_one_is_named_by_argparse(files, capsys):
    trace, config = files
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--trace", str(trace), "--config", str(config), "--gpus-per-host", "0"])
    assert exit_.value.code == 2
    assert "argument --gpus-per-host: '0' must be at least 1" in capsys.readouterr().err
