"""Device inventory of the local launcher, the split of devices among job queues, and how the
launcher tells that a task's process has ended."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from airflow_quota_provider.executors.config import QuotaConfigError, discover_devices, load_config
from airflow_quota_provider.executors.containment import LEFTOVER_GRACE_S, JobCgroup, descendants
from airflow_quota_provider.executors.launcher import Liveness
from airflow_quota_provider.executors.local_launcher import LocalLauncher, kill_tree


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
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def _wait_until(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _supervisor(task: str) -> subprocess.Popen:
    """A stand-in for the launcher's forked child: a subreaper that starts ``task`` (Python code)
    as its child, never reaps it, and lingers, as Airflow's supervisor may."""
    code = (
        "import subprocess, sys, time\n"
        "from airflow_quota_provider.executors.local_launcher import become_subreaper\n"
        "become_subreaper()\n"
        f"c = subprocess.Popen([sys.executable, '-c', {task!r}])\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_the_task_process_is_seen_gone_while_its_supervisor_still_lingers(tmp_path):
    supervisor = _supervisor("import time; time.sleep(1)")
    try:
        task = int(supervisor.stdout.readline())
        launcher = LocalLauncher(tmp_path, cgroups=False)
        assert not launcher.task_exited(supervisor.pid)
        _wait_until(lambda: _state(task) == "Z", "the task process to exit")
        assert supervisor.poll() is None
        assert launcher.task_exited(supervisor.pid)
    finally:
        supervisor.kill()
        supervisor.wait()


# A task whose command used the GPUs: it runs the command, releases its GPUs once the command is
# gone (protocol, 5) and lingers, as a task process does while it ends its try; ``then`` runs after.
RELEASES_AND_LINGERS = (
    "import os, subprocess, sys, time\n"
    "from airflow_quota_provider.protocol import release_gpus\n"
    "subprocess.run({command!r})\n"
    "release_gpus({{'QUOTA_PREEMPT_FILE': {preempt_file!r}}})\n"
    "print('released', flush=True)\n"
    "{then}\n"
    "time.sleep(30)\n"
)


def _releasing_supervisor(tmp_path, *, command=("sleep", "0.2"), then: str = "") -> tuple[subprocess.Popen, LocalLauncher, int]:
    """:func:`_supervisor` with a task that releases its GPUs in job 5's directory, its output on the
    supervisor's: (it, the launcher, the task's pid)."""
    launcher = LocalLauncher(tmp_path, cgroups=False)
    launcher.job_dir(5).mkdir(parents=True)
    supervisor = _supervisor(RELEASES_AND_LINGERS.format(
        command=list(command), preempt_file=str(launcher.preempt_file(5)), then=then))
    return supervisor, launcher, int(supervisor.stdout.readline())


def test_a_task_that_released_its_gpus_counts_as_exited_while_it_ends_its_try(tmp_path):
    supervisor, launcher, task = _releasing_supervisor(tmp_path)
    try:
        assert not launcher.task_exited(supervisor.pid, 5), "its command runs: the GPUs are in use"
        assert supervisor.stdout.readline().strip() == "released"
        assert _state(task) not in ("Z", "gone")
        assert launcher.task_exited(supervisor.pid, 5)
        assert not launcher.task_exited(supervisor.pid), "without the job's directory, only its exit counts"
        assert not launcher.task_exited(supervisor.pid, 6), "released in another job's directory"
    finally:
        supervisor.kill()
        supervisor.wait()


def test_a_released_task_that_starts_another_process_holds_its_gpus_again(tmp_path):
    supervisor, launcher, _ = _releasing_supervisor(
        tmp_path, then="p = subprocess.Popen(['sleep', '30']); print('started', flush=True)"
    )
    try:
        assert supervisor.stdout.readline().strip() == "released"
        assert supervisor.stdout.readline().strip() == "started"
        assert not launcher.task_exited(supervisor.pid, 5)
    finally:
        kill_tree(supervisor.pid)
        supervisor.wait()


def test_a_released_task_holds_its_gpus_while_a_process_its_command_left_runs(tmp_path):
    command = (sys.executable, "-c", LEAVES_A_PROCESS_BEHIND.format(seconds=30))
    supervisor, launcher, _ = _releasing_supervisor(tmp_path, command=command)
    try:
        left = int(supervisor.stdout.readline())
        assert supervisor.stdout.readline().strip() == "released"
        assert _state(left) not in ("Z", "gone")
        assert not launcher.task_exited(supervisor.pid, 5), "adopted by the supervisor: still counted"
        os.kill(left, signal.SIGKILL)
        _wait_until(lambda: launcher.task_exited(supervisor.pid, 5), "the GPUs to be free once it is gone")
    finally:
        kill_tree(supervisor.pid)
        supervisor.wait()


LEAVES_A_PROCESS_BEHIND = (
    "import subprocess, sys; "
    "p = subprocess.Popen(['sleep', '{seconds}'], start_new_session=True); print(p.pid, flush=True)"
)


def test_the_gpus_stay_taken_while_a_process_the_task_started_outlives_it(tmp_path):
    supervisor = _supervisor(LEAVES_A_PROCESS_BEHIND.format(seconds=3))
    try:
        task = int(supervisor.stdout.readline())
        left = int(supervisor.stdout.readline())
        launcher = LocalLauncher(tmp_path, cgroups=False)
        _wait_until(lambda: _state(task) in ("Z", "gone"), "the task process to exit")
        assert _state(left) not in ("Z", "gone")
        assert not launcher.task_exited(supervisor.pid), "adopted by the supervisor: still counted"
        _wait_until(lambda: launcher.task_exited(supervisor.pid), "what the task left behind to exit")
    finally:
        supervisor.kill()
        supervisor.wait()


def test_kill_reaches_what_the_task_started_in_a_session_of_its_own(tmp_path):
    supervisor = _supervisor(LEAVES_A_PROCESS_BEHIND.format(seconds=60) + "; import time; time.sleep(60)")
    task = int(supervisor.stdout.readline())
    left = int(supervisor.stdout.readline())
    kill_tree(supervisor.pid)
    supervisor.wait(timeout=20)
    _wait_until(lambda: _state(task) in ("Z", "gone") and _state(left) in ("Z", "gone"), "the whole tree to die")


def test_an_exit_code_belongs_to_the_launch_that_wrote_it(tmp_path):
    launcher = LocalLauncher(tmp_path, cgroups=False)
    launcher.job_dir(7).mkdir(parents=True)
    (launcher.job_dir(7) / "exit-100").write_text('{"rc": 0}')  # a supervisor that finished late
    assert launcher.exit_info(7, 100).rc == 0
    assert launcher.exit_info(7, 200).rc is None, "the newer launch was killed: no exit code of its own"


# -- containment: nothing a job started outlives it, and its GPUs stay taken until all is gone ----

ESCAPES_AND_IGNORES_SIGTERM = (
    "trap '' TERM; echo $$ > {pidfile}; while :; do sleep 0.1; done"
)


def _escape(pidfile: Path, *, from_thread: bool = False) -> int:
    """The task: starts a child in a session of its own that ignores SIGTERM, and returns 0 at once.
    ``from_thread``: a thread other than the main one forks it, and lives on (the child is listed
    under that thread only)."""
    start = lambda: subprocess.Popen(  # noqa: E731
        ["sh", "-c", ESCAPES_AND_IGNORES_SIGTERM.format(pidfile=pidfile)], start_new_session=True
    )
    if from_thread:
        threading.Thread(target=lambda: start() and time.sleep(600), daemon=True).start()
    else:
        start()
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()):
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.02)
    return 0


def _alive(pid: int) -> bool:
    return _state(pid) not in ("Z", "gone")


def _escaped_alive(escaped: Path) -> bool:
    text = escaped.read_text().strip() if escaped.exists() else ""
    return bool(text) and _alive(int(text))


def _watch_until_ended(launcher: LocalLauncher, handle: str, escaped: Path, timeout: float = 30.0):
    """Poll the launcher as the executor does until it says the launch ended; returns the status,
    the seconds it took and, for every poll, (liveness, whether the escaped process was alive)."""
    start, seen = time.monotonic(), []
    while time.monotonic() - start < timeout:
        status = launcher.status({handle: 1}, session=None)[handle]
        seen.append((status.liveness.value, _escaped_alive(escaped)))
        if status.liveness == Liveness.ENDED:
            return status, time.monotonic() - start, seen
        time.sleep(0.05)
    raise AssertionError(f"the launch never ended: {seen[-5:]}")


def _devices_free_while_escaped_alive(seen) -> list:
    """Polls at which the executor could free the GPUs (ended; task exited, once the try ended)
    while the escaped process still ran."""
    return [poll for poll in seen if poll[0] in ("ended", "task_exited") and poll[1]]


CONTAINMENT = [
    pytest.param(True, id="cgroup"),
    pytest.param(False, id="subreaper"),
]


def _needs(cgroups: bool) -> None:
    if cgroups and JobCgroup.create("probe") is None:
        pytest.skip("this kernel does not let us make a cgroup v2 here; the subreaper case covers it")
    if cgroups:
        JobCgroup.create("probe").remove()


@pytest.mark.parametrize("cgroups", CONTAINMENT)
def test_a_process_the_task_left_in_its_own_session_ignoring_sigterm_ends_before_the_gpus_are_free(tmp_path, cgroups):
    _needs(cgroups)
    launcher = LocalLauncher(tmp_path, cgroups=cgroups)
    escaped = tmp_path / "escaped.pid"
    pid = launcher.start(1, lambda: _escape(escaped), {})
    status, seconds, seen = _watch_until_ended(launcher, f"1:{pid}", escaped)
    assert any(alive for _, alive in seen), "the escape happened"
    assert not _devices_free_while_escaped_alive(seen), "the GPUs would be freed while the escaped process runs"
    assert status.rc == 0
    assert seconds >= LEFTOVER_GRACE_S - 0.5, "SIGTERM is ignored: only the SIGKILL after the grace ends it"
    assert (pid in launcher._cgroups) == cgroups


@pytest.mark.parametrize("cgroups", CONTAINMENT)
def test_kill_ends_a_process_that_escaped_into_its_own_session(tmp_path, cgroups):
    _needs(cgroups)
    launcher = LocalLauncher(tmp_path, cgroups=cgroups)
    escaped = tmp_path / "escaped.pid"
    pid = launcher.start(1, lambda: _escape(escaped) or time.sleep(600) or 0, {})
    _wait_until(lambda: escaped.exists() and escaped.read_text().strip(), "the escape")
    launcher.kill(f"1:{pid}", session=None)
    status, _, seen = _watch_until_ended(launcher, f"1:{pid}", escaped)
    assert not _devices_free_while_escaped_alive(seen) and status.rc is None


def test_with_a_cgroup_a_killed_guard_does_not_lose_what_it_started(tmp_path):
    """The launch's guard dies from outside: its orphans go to init, out of its process tree, but
    not out of its cgroup; the launch is running until they are gone."""
    _needs(True)
    launcher = LocalLauncher(tmp_path, cgroups=True)
    escaped = tmp_path / "escaped.pid"
    pid = launcher.start(1, lambda: _escape(escaped) or time.sleep(600) or 0, {})
    _wait_until(lambda: escaped.exists() and escaped.read_text().strip(), "the escape")
    os.kill(pid, signal.SIGKILL)
    status, _, seen = _watch_until_ended(launcher, f"1:{pid}", escaped)
    assert not _devices_free_while_escaped_alive(seen) and status.rc is None
    assert ("running", True) in seen


def test_a_job_directory_deleted_under_a_running_task_does_not_make_its_success_a_kill(tmp_path):
    launcher = LocalLauncher(tmp_path, cgroups=False)

    def task() -> int:
        shutil.rmtree(launcher.job_dir(1))
        return 0

    pid = launcher.start(1, task, {})
    _wait_until(lambda: launcher.status({f"1:{pid}": 1}, session=None)[f"1:{pid}"].liveness == Liveness.ENDED, "the end")
    assert launcher.exit_info(1, pid).rc == 0
    names = [p.name for p in launcher.job_dir(1).iterdir()]
    assert f"exit-{pid}" in names and not [n for n in names if n.startswith(".")]  # written whole, no temporary left


def test_the_cgroup_of_a_launch_forgotten_while_its_supervisor_finishes_is_removed_once_empty(tmp_path):
    _needs(True)
    launcher = LocalLauncher(tmp_path, cgroups=True)
    pid = launcher.start(1, lambda: time.sleep(1) or 0, {})
    cgroup = launcher.cgroup(1, pid)
    launcher.forget(f"1:{pid}", session=None)  # the executor settles on task_exited, before the supervisor ends
    assert cgroup.path.exists()
    _wait_until(lambda: launcher.reap() or not cgroup.path.exists(), "the emptied cgroup to be removed")


def test_empty_launch_cgroups_left_by_a_stopped_scheduler_are_removed_when_old(tmp_path):
    _needs(True)
    old, young = JobCgroup.create("job-0-old"), JobCgroup.create("job-0-young")
    os.utime(old.path, (time.time() - 3600, time.time() - 3600))
    LocalLauncher(tmp_path, cgroups=True)
    assert not old.path.exists() and young.path.exists()
    young.remove()


def test_a_task_seen_running_then_gone_frees_its_launch_before_its_supervisor_exits(tmp_path):
    """TASK_EXITED only once the launcher has seen the task run (a supervisor whose task has not
    started yet looks the same): then the executor may free a preempted job's GPUs at once."""
    gate, task_pid = tmp_path / "go", tmp_path / "task.pid"
    task_code = (
        f"import os, time\nopen({str(task_pid)!r}, 'w').write(str(os.getpid()))\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\ntime.sleep(0.5)"
    )

    def supervise() -> int:
        subprocess.Popen([sys.executable, "-c", task_code]).wait()
        time.sleep(60)  # lingers, as Airflow's supervisor may
        return 0

    launcher = LocalLauncher(tmp_path, cgroups=False)
    pid = launcher.start(7, supervise, {})
    handle = f"7:{pid}"
    try:
        _wait_until(lambda: task_pid.exists() and task_pid.read_text(), "the task to start")
        assert launcher.status({handle: 7}, session=None)[handle].liveness == Liveness.RUNNING
        gate.touch()
        _wait_until(lambda: not _alive(int(task_pid.read_text())), "the task process to exit")
        assert _alive(launcher.supervisor(7, pid)), "the supervisor lingers"
        assert launcher.status({handle: 7}, session=None)[handle].liveness == Liveness.TASK_EXITED
        fresh = LocalLauncher(tmp_path, cgroups=False)  # never saw the task: cannot tell it from one not started
        assert fresh.status({handle: 7}, session=None)[handle].liveness == Liveness.RUNNING
    finally:
        launcher.kill(handle, session=None)
        _wait_until(lambda: launcher.status({handle: 7}, session=None)[handle].liveness == Liveness.ENDED, "the kill")


@pytest.mark.parametrize("cgroups", CONTAINMENT)
def test_a_killed_supervisor_holds_the_gpus_until_what_it_left_is_gone(tmp_path, cgroups):
    """The task supervisor dies from outside (say the OOM killer) while a process its task started
    in a session of its own runs on: the launch is running until that process is gone too."""
    _needs(cgroups)
    launcher = LocalLauncher(tmp_path, cgroups=cgroups)
    escaped, supervisor = tmp_path / "escaped.pid", tmp_path / "supervisor.pid"

    def run() -> int:
        supervisor.write_text(str(os.getpid()))
        return _escape(escaped) or time.sleep(600) or 0

    pid = launcher.start(1, run, {})
    _wait_until(lambda: _escaped_alive(escaped) and supervisor.exists(), "the escape")
    os.kill(int(supervisor.read_text()), signal.SIGKILL)
    status, _, seen = _watch_until_ended(launcher, f"1:{pid}", escaped)
    assert ("running", True) in seen, "the escaped process ran on after its supervisor was killed"
    assert not _devices_free_while_escaped_alive(seen), "the GPUs would be freed while the escaped process runs"
    assert not _escaped_alive(escaped) and status.rc is None


def test_a_child_forked_by_a_thread_other_than_the_main_one_is_part_of_the_tree(tmp_path):
    escaped = tmp_path / "escaped.pid"
    code = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from pathlib import Path\n"
        "from test_local_launcher import _escape\n"
        f"_escape(Path({str(escaped)!r}), from_thread=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        _wait_until(lambda: _escaped_alive(escaped), "the escape")
        assert int(escaped.read_text()) in descendants(proc.pid)
        kill_tree(proc.pid)
        proc.wait(timeout=20)
        _wait_until(lambda: not _escaped_alive(escaped), "the thread-forked child to die with the tree")
    finally:
        proc.kill()
        proc.wait()


def test_kill_reaches_a_child_that_a_task_thread_forked(tmp_path):
    launcher = LocalLauncher(tmp_path, cgroups=False)  # the tree alone: a cgroup would catch it anyway
    escaped = tmp_path / "escaped.pid"
    pid = launcher.start(1, lambda: _escape(escaped, from_thread=True) or time.sleep(600) or 0, {})
    _wait_until(lambda: _escaped_alive(escaped), "the escape")
    launcher.kill(f"1:{pid}", session=None)
    status, _, seen = _watch_until_ended(launcher, f"1:{pid}", escaped)
    assert not _devices_free_while_escaped_alive(seen) and status.rc is None
    assert not _escaped_alive(escaped)


@pytest.mark.parametrize("cgroups", CONTAINMENT)
def test_a_restarted_worker_ends_the_launches_an_earlier_one_left_running(tmp_path, cgroups):
    """What a host proves before its GPUs are handed out again: every launch recorded in its job
    directories that still runs is killed, and seen gone; launches that ended are left alone.
    With a cgroup, even a launch whose guard was killed is found by its cgroup."""
    _needs(cgroups)
    earlier = LocalLauncher(tmp_path, cgroups=cgroups)
    escaped = tmp_path / "escaped.pid"
    done = earlier.start(1, lambda: 0, {})
    _wait_until(lambda: earlier.status({f"1:{done}": 1}, session=None)[f"1:{done}"].liveness == Liveness.ENDED, "job 1")
    pid = earlier.start(2, lambda: _escape(escaped) or time.sleep(600) or 0, {})
    _wait_until(lambda: _escaped_alive(escaped), "the escape")
    if cgroups:
        os.kill(pid, signal.SIGKILL)  # the guard is gone; its cgroup still holds the escaped process
    restarted = LocalLauncher(tmp_path, cgroups=cgroups)
    assert restarted.running(2) and not restarted.running(1)
    assert restarted.end_leftovers() == ["2"]
    assert not _escaped_alive(escaped) and not restarted.running(2)
    assert restarted.end_leftovers() == []
    earlier.reap()


def test_a_launchs_supervisor_finds_the_api_clients_tls_context_built(tmp_path):
    """Its start waits on nothing the launcher could have built once: the client's context, cached
    by Airflow per process, comes with the fork."""
    code = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from airflow.sdk.api.client import Client
        from airflow_quota_provider.executors.local_launcher import LocalLauncher

        def supervisor():
            before = Client._get_ssl_context_cached.cache_info()
            Client(base_url="http://127.0.0.1:9/execution/", token="t")
            after = Client._get_ssl_context_cached.cache_info()
            Path({str(tmp_path / "built")!r}).write_text(str(after.misses - before.misses))
            return 0

        pid = LocalLauncher(Path({str(tmp_path)!r}), cgroups=False).start("1", supervisor, {{}})
        os.waitpid(pid, 0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert (tmp_path / "built").read_text() == "0"


# A GPU host's launch (celery_worker.run_launch) in a process of its own: it makes its process a
# subreaper and ends every descendant of it when the launch is over.
HOST_LAUNCH = textwrap.dedent("""
    import json, subprocess, sys, time
    from pathlib import Path
    from airflow_quota_provider.executors.celery_worker import run_launch
    from airflow_quota_provider.executors.local_launcher import LocalLauncher

    TASK = '''
    import json, os, subprocess, sys, time
    from airflow_quota_provider.protocol import release_gpus
    subprocess.run(["sleep", "0.3"])
    release_gpus(os.environ)
    released = time.time()
    time.sleep(LINGER)
    print(json.dumps({"released": released, "exiting": time.time()}), flush=True)
    '''
    told = []
    rc = run_launch(LocalLauncher(Path(sys.argv[1]), cgroups=False), 9,
                    lambda: subprocess.call([sys.executable, "-c", TASK]), {}, on_task_exit=lambda: told.append(time.time()))
    print(json.dumps({"told": told, "rc": rc}), flush=True)
""")


def test_a_host_reports_a_task_that_released_its_gpus_as_exited_before_its_process_ends(tmp_path):
    """The launch's watch looks for the release once the command is gone, so the GPUs are free
    while the task process still ends its try (here it lingers 3 s)."""
    out = subprocess.run([sys.executable, "-c", HOST_LAUNCH.replace("LINGER", "3"), str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    task = json.loads(out[-2])
    launch = json.loads(out[-1])
    assert launch["rc"] == 0
    assert len(launch["told"]) == 1
    assert task["released"] <= launch["told"][0] < task["exiting"], (task, launch)
