"""Device inventory of the local launcher, the split of devices among job queues, and how the
launcher tells that a task's process has ended."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from airflow_quota_provider.executors.local_launcher import LocalLauncher, discover_devices
from airflow_quota_provider.executors.quota_executor import QuotaConfigError, load_config


def test_listed_devices_win():
    assert discover_devices(" 2, 3,5 ", 8) == (["2", "3", "5"], "[quota] devices")


def test_a_device_listed_twice_is_refused():
    with pytest.raises(ValueError, match=r"\[quota\] devices: '1,1' lists a device twice"):
        discover_devices("1,1", 8)


def test_without_devices_or_nvidia_smi_virtual_gpus_are_used(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi on it
    assert discover_devices("", 3) == (["0", "1", "2"], "[quota] virtual_gpus")


def _quota_file(tmp_path, text: str) -> str:
    path = tmp_path / "quotas.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_devices_are_split_among_queues_in_file_order(tmp_path):
    path = _quota_file(tmp_path, """
        queues:
          - {name: first, capacity: 2, quotas: [{name: team-a, capacity: 2}]}
          - {name: second, capacity: 1, quotas: [{name: team-b, capacity: 1}]}
    """)
    _, split = load_config(path, ["0", "1", "2", "3"])
    assert split == {"first": ["0", "1"], "second": ["2"]}


def test_queues_larger_than_the_inventory_are_refused_naming_the_field(tmp_path):
    path = _quota_file(tmp_path, """
        queues:
          - {name: big, capacity: 16, quotas: [{name: team-a, capacity: 16}]}
    """)
    with pytest.raises(QuotaConfigError, match=r"queues\[0\]\.capacity: 16 GPUs, but only 8"):
        load_config(path, [str(i) for i in range(8)])


def test_a_bad_field_is_named(tmp_path):
    path = _quota_file(tmp_path, """
        queues:
          - {name: q, capacity: 2, quotas: [{name: team-a, capacity: 2, sharing: bogus}]}
    """)
    with pytest.raises(QuotaConfigError, match=r"queues\[0\]\.quotas\[0\]\.sharing: 'bogus' is not one of"):
        load_config(path, ["0", "1"])


def test_an_unset_quota_file_is_refused():
    with pytest.raises(QuotaConfigError, match=r"\[quota\] quota_file: not set"):
        load_config("", ["0"])


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_task_process_is_seen_gone_while_its_supervisor_still_lingers(tmp_path):
    # Like Airflow's supervisor that has not yet noticed its task's exit: the child is a zombie.
    supervisor = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, time; c = subprocess.Popen(['sleep', '1']); "
         "print(c.pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        child = int(supervisor.stdout.readline())
        launcher = LocalLauncher(tmp_path)
        assert not launcher.task_exited(supervisor.pid)
        deadline = time.monotonic() + 20
        while _state(child) != "Z":
            assert time.monotonic() < deadline, "the task process never exited"
            time.sleep(0.05)
        assert supervisor.poll() is None
        assert launcher.task_exited(supervisor.pid)
    finally:
        supervisor.kill()
        supervisor.wait()
