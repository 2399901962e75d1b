"""Checkpoints that follow the job: ``[quota] checkpoint_root`` on shared storage or an object store.

Two "hosts" are two ``[quota] state_dir`` (each its own local disk) that share one checkpoint root.
The object store is fsspec's real ``memory://`` filesystem, attached through Airflow's
``ObjectStoragePath`` machinery; it lives in one process, so the runs that use it execute in this
process (the operator's ``execute``) or in the driver process of ``dag.test()`` (``supervise=False``).
The shared-directory cases run each attempt in a real task process forked by the Task SDK supervisor.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import fsspec
import pytest

from tests.operators.quota_airflow import (  # first: it keeps Airflow away from ~/airflow
    TRAIN_SCRIPT,
    make_airflow_home,
    read_events,
    wait_for,
    write_preempt_file,
)
from airflow.sdk import ObjectStoragePath
from airflow.sdk.exceptions import AirflowException
from airflow.sdk.io import attach

from airflow_quota_provider.operators.arguments import QuotaTaskArgumentError
from airflow_quota_provider.operators.checkpoints import (
    RESUMED_FROM_FILE,
    checkpoint_location,
    latest_checkpoint,
    task_instance_checkpoint_dir,
)
from airflow_quota_provider.operators.training import QuotaTrainingOperator


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    return make_airflow_home(tmp_path_factory.mktemp("quota-ckpt-home"))


@pytest.fixture
def memory_store():
    """A bucket of its own in fsspec's in-process memory filesystem; yields its URL."""
    fs = fsspec.filesystem("memory")
    attach("memory", fs=fs)
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    yield f"memory://{bucket}"
    with contextlib.suppress(FileNotFoundError):
        fs.rm(f"/{bucket}", recursive=True)


@pytest.fixture
def quota_env(monkeypatch):
    """No executor environment leaks in; return a setter for ``[quota]`` options (None: unset)."""
    for name in ("QUOTA_PREEMPT_FILE", "QUOTA_GRACE_PERIOD_S", "QUOTA_PREEMPTION_COUNT", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)

    def set_option(name: str, value: str | os.PathLike | None) -> None:
        if value is None:
            monkeypatch.delenv(f"AIRFLOW__QUOTA__{name.upper()}", raising=False)
        else:
            monkeypatch.setenv(f"AIRFLOW__QUOTA__{name.upper()}", str(value))

    set_option("checkpoint_root", None)
    return set_option


def _context(dag_id="train_dag", run_id="manual__2026-01-01T00:00:00+00:00", task_id="train", map_index=-1):
    return {"ti": SimpleNamespace(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index)}


def _store_files(url: str) -> list[str]:
    """Every object under ``url``, relative to it, but the attempts' records of where they resumed."""
    root = ObjectStoragePath(url)
    base = root.path.rstrip("/")
    return sorted(p[len(base) + 1 :] for p in root.fs.find(base) if not p.endswith(f"/{RESUMED_FROM_FILE}"))


# ---------------------------------------------------------------------------------------------
# Where the checkpoints of a task instance live


def test_without_a_checkpoint_root_checkpoints_stay_under_the_state_dir(quota_env, tmp_path):
    quota_env("state_dir", tmp_path / "state")
    ctx = _context(run_id="manual__2026-01-01T00:00:00+00:00", map_index=3)
    assert task_instance_checkpoint_dir(ctx) == Path(
        tmp_path, "state", "checkpoints", "train_dag", "manual__2026-01-01T00_00_00+00_00", "train", "3"
    )


@pytest.mark.parametrize(
    ("root", "expected"),
    [
        pytest.param("/shared/ckpt", Path("/shared/ckpt/d/r/t"), id="absolute path used in place"),
        pytest.param("file:///shared/ckpt", Path("/shared/ckpt/d/r/t"), id="file URL is a local path"),
        pytest.param("file://localhost/shared/my%20ckpt", Path("/shared/my ckpt/d/r/t"), id="file URL localhost"),
    ],
)
def test_a_local_checkpoint_root_is_a_local_directory(quota_env, root, expected):
    quota_env("checkpoint_root", root)
    assert task_instance_checkpoint_dir(_context("d", "r", "t")) == expected


def test_an_object_store_checkpoint_root_gives_an_object_storage_path(quota_env, memory_store):
    quota_env("checkpoint_root", f"{memory_store}/airflow/")
    location = task_instance_checkpoint_dir(_context("d", "r", "t", map_index=0))
    assert isinstance(location, ObjectStoragePath)
    assert str(location) == f"{memory_store}/airflow/d/r/t/0"


@pytest.mark.parametrize(
    ("root", "fragment"),
    [
        pytest.param("ckpt", "is a relative path", id="relative path"),
        pytest.param("file://nfs-server/ckpt", "is not a local file URL", id="file URL with a host"),
    ],
)
def test_a_bad_checkpoint_root_is_an_error_naming_the_option(quota_env, root, fragment):
    quota_env("checkpoint_root", root)
    with pytest.raises(QuotaTaskArgumentError) as err:
        task_instance_checkpoint_dir(_context())
    assert err.value.field == "[quota] checkpoint_root"
    assert fragment in str(err.value)


def test_dot_run_ids_do_not_collapse_two_task_instances_into_one_directory(quota_env, tmp_path):
    """A run id ``..`` would otherwise name the dag's parent directory (``<root>/<task_id>``)."""
    quota_env("checkpoint_root", tmp_path)
    dirs = {
        run_id: task_instance_checkpoint_dir(_context("d", run_id, "t"))
        for run_id in ("..", ".", "...", "_..", "~..", "x/../..")
    }
    assert dirs[".."] == tmp_path / "d" / "~.." / "t"
    assert dirs["."] == tmp_path / "d" / "~." / "t"
    assert dirs["..."] == tmp_path / "d" / "..." / "t"  # an ordinary name, sanitised as ever
    assert len(set(dirs.values())) == len(dirs) - 1  # "_.." and "~.." both sanitise to "_..", as ever
    for path in dirs.values():
        assert Path(os.path.normpath(path)).parent.parent == tmp_path / "d"


def test_checkpoint_location_reads_paths_file_urls_and_object_store_urls(memory_store):
    assert checkpoint_location("relative/dir") == Path("relative/dir")
    assert checkpoint_location("file:///data/ckpt") == Path("/data/ckpt")
    assert checkpoint_location(ObjectStoragePath("file:///data/ckpt")) == Path("/data/ckpt")
    remote = checkpoint_location(f"{memory_store}/x")
    assert isinstance(remote, ObjectStoragePath) and remote.protocol == "memory"
    with pytest.raises(QuotaTaskArgumentError, match=r"^checkpoint_dir: "):
        checkpoint_location("  ")


# ---------------------------------------------------------------------------------------------
# latest_checkpoint in an object store


def test_latest_checkpoint_in_an_object_store_is_the_object_written_last(memory_store):
    store = ObjectStoragePath(f"{memory_store}/ckpt")
    assert latest_checkpoint(store) is None  # nothing there yet
    (store / "ckpt-00000020.pt").write_bytes(b"20")
    time.sleep(0.01)
    (store / "ckpt-00000010.pt").write_bytes(b"10")  # rewritten later: newer, whatever its name
    (store / ".ckpt-00000030.pt.tmp").write_bytes(b"in progress")
    (store / "ckpt-00000040.pt.partial").write_bytes(b"in progress")
    newest = latest_checkpoint(store)
    assert isinstance(newest, ObjectStoragePath) and newest.name == "ckpt-00000010.pt"
    assert latest_checkpoint(str(store)) == newest  # a URL string reads the same
    time.sleep(0.01)
    (store / "step-50" / "model.bin").write_bytes(b"a directory checkpoint")
    assert latest_checkpoint(store).name == "step-50"  # a prefix is as new as its newest object
    time.sleep(0.01)
    (store / "ckpt-00000010.pt").write_bytes(b"10 again")
    assert latest_checkpoint(store).name == "ckpt-00000010.pt"


def test_latest_checkpoint_through_a_file_url_reads_the_local_directory(tmp_path):
    (tmp_path / "a.pt").write_text("a")
    (tmp_path / "b.pt").write_text("b")
    os.utime(tmp_path / "a.pt", (2000, 2000))
    os.utime(tmp_path / "b.pt", (1000, 1000))
    assert latest_checkpoint(f"file://{tmp_path}") == tmp_path / "a.pt"
    os.utime(tmp_path / "b.pt", (2000, 2000))
    assert latest_checkpoint(f"file://{tmp_path}") == tmp_path / "b.pt"  # a tie: the name decides


# ---------------------------------------------------------------------------------------------
# The operator syncing with an object store, two hosts (in this process: the store is in memory)


RECORD_AND_CHECKPOINT = """
set -e
printf '{"dir": "%s", "resume_from": "%s", "resumed": "%s"}\\n' \
    "$QUOTA_CHECKPOINT_DIR" "$QUOTA_RESUME_FROM" "$(cat "${QUOTA_RESUME_FROM:-/dev/null}")" >> EVENTS
for step in STEPS; do
    echo "weights@$step" > "$QUOTA_CHECKPOINT_DIR/.ckpt.tmp"
    mv "$QUOTA_CHECKPOINT_DIR/.ckpt.tmp" "$QUOTA_CHECKPOINT_DIR/ckpt-$step.pt"
done
exit EXIT
"""


def _host_run(quota_env, tmp_path, host: str, steps: str, exit_code: int = 0):
    quota_env("state_dir", tmp_path / host)
    events = tmp_path / "events.jsonl"
    command = RECORD_AND_CHECKPOINT.replace("EVENTS", str(events)).replace("STEPS", steps)
    op = QuotaTrainingOperator(task_id="train", quota="team-a", command=command.replace("EXIT", str(exit_code)))
    try:
        return op.execute(_context())
    finally:
        assert not list((tmp_path / host / "checkpoint-sync").rglob("*.pt"))  # the working copy is gone


def test_a_run_on_another_host_resumes_from_the_newest_checkpoint_in_the_store(quota_env, memory_store, tmp_path):
    quota_env("checkpoint_root", f"{memory_store}/airflow")
    task_dir = "train_dag/manual__2026-01-01T00_00_00+00_00/train"

    first = _host_run(quota_env, tmp_path, "host-a", "00000010 00000020")
    assert first == f"{memory_store}/airflow/{task_dir}/attempt-00001/ckpt-00000020.pt"  # XCom: the object's URL
    assert _store_files(f"{memory_store}/airflow") == [
        f"{task_dir}/attempt-00001/ckpt-00000010.pt",
        f"{task_dir}/attempt-00001/ckpt-00000020.pt",
    ]

    second = _host_run(quota_env, tmp_path, "host-b", "00000030")
    assert second == f"{memory_store}/airflow/{task_dir}/attempt-00002/ckpt-00000030.pt"
    a, b = read_events(tmp_path / "events.jsonl")
    assert a["resume_from"] == "" and Path(a["dir"]).is_relative_to(tmp_path / "host-a" / "checkpoint-sync" / task_dir)
    assert Path(b["dir"]).is_relative_to(tmp_path / "host-b" / "checkpoint-sync" / task_dir)
    assert b["resume_from"] == f"{b['dir']}/ckpt-00000020.pt"  # only the newest was downloaded
    assert b["resumed"] == "weights@00000020"
    assert latest_checkpoint(f"{memory_store}/airflow/{task_dir}").name == "ckpt-00000030.pt"
    assert len(_store_files(f"{memory_store}/airflow")) == 3  # the download was not uploaded back


def test_a_failed_command_still_uploads_its_checkpoints(quota_env, memory_store, tmp_path):
    quota_env("checkpoint_root", memory_store)
    with pytest.raises(AirflowException, match="Command exited with code 3"):
        _host_run(quota_env, tmp_path, "host-a", "00000010", exit_code=3)
    assert [Path(f).name for f in _store_files(memory_store)] == ["ckpt-00000010.pt"]


def test_a_store_without_a_filesystem_is_an_error_naming_the_setting(quota_env, tmp_path):
    quota_env("state_dir", tmp_path / "state")
    op = QuotaTrainingOperator(task_id="train", quota="team-a", command="true", checkpoint_dir="nosuchfs://b/ckpt")
    with pytest.raises(QuotaTaskArgumentError, match=r"^checkpoint_dir: 'nosuchfs://b/ckpt': no filesystem"):
        op.execute(_context())
    quota_env("checkpoint_root", "nosuchfs://b/ckpt")
    with pytest.raises(QuotaTaskArgumentError, match=r"^\[quota\] checkpoint_root: 'nosuchfs://b/ckpt': no filesystem"):
        task_instance_checkpoint_dir(_context())


def test_an_unreachable_store_fails_the_task_naming_the_store(quota_env, tmp_path):
    """fsspec knows ftp://, but no installed provider gives Airflow a filesystem for it (and port 1 has
    no server): the first use fails, before the command starts."""
    quota_env("state_dir", tmp_path / "state")
    op = QuotaTrainingOperator(
        task_id="train", quota="team-a", command=f"touch {tmp_path}/ran", checkpoint_dir="ftp://127.0.0.1:1/ckpt"
    )
    with pytest.raises(AirflowException, match=r"^Could not download the newest checkpoint from ftp://"):
        op.execute(_context())
    assert not (tmp_path / "ran").exists()
    assert not list((tmp_path / "state" / "checkpoint-sync").rglob("run-*"))  # no working copy left behind


def test_directory_checkpoints_are_synced_whole(quota_env, memory_store, tmp_path):
    command = 'mkdir -p "$QUOTA_CHECKPOINT_DIR/step-7" && echo w > "$QUOTA_CHECKPOINT_DIR/step-7/model.bin"'
    quota_env("state_dir", tmp_path / "host-a")
    op = QuotaTrainingOperator(task_id="train", quota="team-a", command=command, checkpoint_dir=f"{memory_store}/c")
    assert op.execute(_context()) == f"{memory_store}/c/attempt-00001/step-7"
    assert _store_files(f"{memory_store}/c") == ["attempt-00001/step-7/model.bin"]

    quota_env("state_dir", tmp_path / "host-b")
    op = QuotaTrainingOperator(
        task_id="train", quota="team-a", checkpoint_dir=f"{memory_store}/c",
        command=f'cat "$QUOTA_RESUME_FROM/model.bin" > {tmp_path}/resumed',
    )  # fmt: skip
    op.execute(_context())
    assert (tmp_path / "resumed").read_text() == "w\n"


# ---------------------------------------------------------------------------------------------
# Fencing: an attempt given up (its host lost) that still runs never becomes a newer one's resume point


def _write_checkpoints(*steps: str) -> str:
    """Bash that writes each ``NAME=CONTENT`` as a checkpoint, as a script does (temporary name, then rename)."""
    return "".join(
        f'echo {content} > "$QUOTA_CHECKPOINT_DIR/.{name}.tmp"; '
        f'mv "$QUOTA_CHECKPOINT_DIR/.{name}.tmp" "$QUOTA_CHECKPOINT_DIR/{name}"; '
        for name, content in (step.split("=") for step in steps)
    )


RECORD_RESUMED = 'echo "$(cat "${{QUOTA_RESUME_FROM:-/dev/null}}")" >> {resumed}; '


def _attempt(command: str):
    return QuotaTrainingOperator(task_id="train", quota="team-a", command=f"set -e; {command}").execute(_context())


def _read(checkpoint: str) -> str:
    return (ObjectStoragePath(checkpoint) if "://" in checkpoint else Path(checkpoint)).read_text().strip()


@pytest.mark.parametrize(
    "newer_wrote_one",
    [pytest.param(True, id="newer attempt checkpointed"), pytest.param(False, id="newer attempt wrote none")],
)
@pytest.mark.parametrize(
    "where", [pytest.param("shared", id="shared directory"), pytest.param("store", id="object store")]
)
def test_a_stale_attempt_writing_after_a_newer_one_started_is_never_resumed_from(
    quota_env, memory_store, tmp_path, where, newer_wrote_one
):
    """Attempt 1 is given up but runs on (its host was cut off) while attempt 2 runs; it writes two
    checkpoints after attempt 2 started, one of them under a name attempt 2 used. Attempt 3 resumes
    from attempt 2's checkpoint, or, when attempt 2 wrote none, from what attempt 2 resumed from:
    attempt 1's first checkpoint in a shared directory; nothing in a store, which a command's
    checkpoints reach only when it exits."""
    quota_env("state_dir", tmp_path / "state")
    root = str(tmp_path / "shared") if where == "shared" else f"{memory_store}/airflow"
    quota_env("checkpoint_root", root)
    started, go, resumed = tmp_path / "started", tmp_path / "go", tmp_path / "resumed"
    stale_errors: list[BaseException] = []

    def stale_attempt() -> None:
        try:
            _attempt(
                _write_checkpoints("ckpt-010=a1@10")
                + f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done; "  # runs on, given up
                + _write_checkpoints("ckpt-020=a1@20", "ckpt-030=a1@30")
            )
        except BaseException as e:
            stale_errors.append(e)

    first = threading.Thread(target=stale_attempt)
    first.start()
    try:
        wait_for(started.exists, "attempt 1 to checkpoint")
        writes = _write_checkpoints("ckpt-020=a2@20") if newer_wrote_one else ""
        second = _attempt(RECORD_RESUMED.format(resumed=resumed) + writes)
    finally:
        go.touch()
        first.join(timeout=60)
    assert not first.is_alive() and not stale_errors
    _attempt(RECORD_RESUMED.format(resumed=resumed))

    taken_up = "a1@10" if where == "shared" else ""  # what attempt 2 found when it started
    assert resumed.read_text().split("\n")[:-1] == [taken_up, "a2@20" if newer_wrote_one else taken_up]
    if newer_wrote_one:
        assert _read(second) == "a2@20", "the stale attempt did not overwrite the newer one's checkpoint"
    newest = latest_checkpoint(f"{root}/train_dag/manual__2026-01-01T00_00_00+00_00/train")
    assert (newest and _read(str(newest))) == ("a2@20" if newer_wrote_one else taken_up or None)


# ---------------------------------------------------------------------------------------------
# End to end through dag.test(): preempted on one host, resumed on another


SHARED_DIR_DAG = """
import os
from pathlib import Path

from airflow.sdk import DAG
from airflow_quota_provider.operators.training import QuotaTrainingOperator

# Each attempt runs in a task process of its own, which parses this file: once the first attempt's
# command has started, later attempts play another GPU host, with a local disk (state_dir) of its own.
# (Only in this DAG's own test run: dag.test() parses every file of the DAG folder.)
if os.environ.get("TWO_HOSTS_DAG") == {dag_id!r}:
    os.environ["AIRFLOW__QUOTA__STATE_DIR"] = {host_b!r} if Path({marker!r}).exists() else {host_a!r}

with DAG({dag_id!r}, schedule=None) as dag:
    QuotaTrainingOperator(task_id="job", quota="team-a", command={command!r}, grace_period=30, retries=0)
"""

SHARED_DIR_COMMAND = """
printf '{{"state_dir": "%s", "dir": "%s", "resume_from": "%s"}}\\n' \
    "$AIRFLOW__QUOTA__STATE_DIR" "$QUOTA_CHECKPOINT_DIR" "$QUOTA_RESUME_FROM" >> {events}
if [ -n "$QUOTA_RESUME_FROM" ]; then exit 0; fi
echo 1 > "$QUOTA_CHECKPOINT_DIR/ckpt-1"
trap 'echo 2 > "$QUOTA_CHECKPOINT_DIR/ckpt-2"; exit 143' TERM
touch {marker}
sleep 120 & wait
"""


@pytest.mark.parametrize("as_url", [pytest.param(False, id="plain path"), pytest.param(True, id="file URL")])
def test_preempted_on_one_host_resumed_on_another_from_a_shared_directory(airflow_home, tmp_path, as_url):
    dag_id = f"shared_dir_{'url' if as_url else 'path'}"
    shared, events, marker, preempt = tmp_path / "shared", tmp_path / "events.jsonl", tmp_path / "started", tmp_path / "p"
    command = SHARED_DIR_COMMAND.format(events=events, marker=marker)
    host_a, host_b = str(tmp_path / "host-a"), str(tmp_path / "host-b")
    airflow_home.write_dag(
        dag_id, SHARED_DIR_DAG.format(dag_id=dag_id, command=command, marker=str(marker), host_a=host_a, host_b=host_b)
    )
    root = f"file://{shared}" if as_url else str(shared)
    run = airflow_home.start_dag_test(
        dag_id,
        {"QUOTA_PREEMPT_FILE": str(preempt), "AIRFLOW__QUOTA__CHECKPOINT_ROOT": root, "TWO_HOSTS_DAG": dag_id},
    )
    wait_for(marker.exists, "the command to start", run=run)
    write_preempt_file(preempt, reason="reclaim", preemptor="j9", deadline=time.time() + 30)
    result = run.wait()

    assert [(a["state"], a["try_number"]) for a in result["attempts"]] == [("up_for_reschedule", 1), ("success", 1)]
    a, b = read_events(events)
    assert (a["state_dir"], b["state_dir"]) == (host_a, host_b)  # two hosts
    task_dir = Path(a["dir"]).parent  # one directory, used in place on the shared storage
    assert (Path(a["dir"]).name, b["dir"]) == ("attempt-00001", str(task_dir / "attempt-00002"))
    assert (task_dir.parent.parent.parent, task_dir.parent.parent.name, task_dir.name) == (shared, dag_id, "job")
    assert task_dir.parent.name.startswith("manual__")  # the run id, sanitised
    assert a["resume_from"] == "" and b["resume_from"] == str(task_dir / "attempt-00001" / "ckpt-2")
    assert not Path(host_a, "checkpoints").exists() and not Path(host_b, "checkpoints").exists()


MEMORY_STORE_DAG = """
import json

import fsspec
from airflow.sdk import DAG, task
from airflow.sdk.io import attach
from airflow_quota_provider.operators.training import QuotaTrainingOperator

# The "remote" store: fsspec's memory filesystem, shared by the attempts of this (driver) process.
attach("memory", fs=fsspec.filesystem("memory"))

with DAG({dag_id!r}, schedule=None) as dag:
    train = QuotaTrainingOperator(
        task_id="train",
        quota="team-b",
        command={command!r},
        grace_period=60,
        retries=0,
    )

    @task
    def list_store():
        with open({listing!r}, "w") as f:
            json.dump(sorted(p for p in fsspec.filesystem("memory").find("/ckpt-bucket") if "/." not in p), f)

    train >> list_store()
"""


def test_preempted_training_uploads_its_checkpoint_and_resumes_from_the_store(airflow_home, tmp_path):
    """The PyTorch script checkpoints on SIGTERM; the operator uploads that checkpoint within the grace
    period; the next attempt starts in a fresh local directory, downloads it and resumes."""
    dag_id = "memory_store_training"
    events, preempt, listing = tmp_path / "events.jsonl", tmp_path / "preempt.json", tmp_path / "listing.json"
    command = (
        f"{sys.executable} {TRAIN_SCRIPT} --steps 150 --checkpoint-every 20 --step-sleep 0.02 --threads 1"
        f" --events {events} --seed 7"
    )
    airflow_home.write_dag(dag_id, MEMORY_STORE_DAG.format(dag_id=dag_id, command=command, listing=str(listing)))
    state_dir = tmp_path / "state"
    run = airflow_home.start_dag_test(
        dag_id,
        {
            "QUOTA_PREEMPT_FILE": str(preempt),
            "AIRFLOW__QUOTA__CHECKPOINT_ROOT": "memory://ckpt-bucket/airflow",
            "AIRFLOW__QUOTA__STATE_DIR": str(state_dir),
        },
        supervise=False,  # the memory store lives in the driver process
    )
    wait_for(lambda: any(e["event"] == "checkpoint" for e in read_events(events)), "a checkpoint", run=run)
    write_preempt_file(preempt, reason="reclaim", preemptor="team-a/job-7", deadline=time.time() + 60)
    result = run.wait()
    output = run.output()

    assert [(a["task_id"], a["state"], a["try_number"]) for a in result["attempts"]] == [
        ("train", "up_for_reschedule", 1),
        ("train", "success", 1),
        ("list_store", "success", 1),
    ]
    assert "Command stopped within the grace period" in output
    log = read_events(events)
    starts = [e for e in log if e["event"] == "start"]
    first = [e for e in log if e["pid"] == starts[0]["pid"]]
    stop_checkpoint = first[-2]
    assert [e["event"] for e in first[-3:]] == ["sigterm", "checkpoint", "exit"]
    first_dir, second_dir = Path(stop_checkpoint["path"]).parent, Path(starts[1]["resume_from"]).parent
    assert first_dir != second_dir  # a fresh local working copy: the checkpoint came from the store
    assert first_dir.parent == second_dir.parent and first_dir.parent.is_relative_to(state_dir / "checkpoint-sync")
    assert Path(starts[1]["resume_from"]).name == Path(stop_checkpoint["path"]).name
    assert starts[1]["start_step"] == stop_checkpoint["step"] > 0
    assert not first_dir.exists() and not second_dir.exists()  # removed once uploaded

    stored = json.loads(listing.read_text())
    prefix = f"/ckpt-bucket/airflow/{dag_id}/"
    assert all(p.startswith(prefix) and p.split("/")[-3] == "train" for p in stored)
    assert {p.split("/")[-2] for p in stored} == {"attempt-00001", "attempt-00002"}
    names = sorted(Path(p).name for p in stored)
    first_run = [n for n in names if int(n[5:13]) <= stop_checkpoint["step"]]
    assert first_run == [Path(stop_checkpoint["path"]).name]  # preempted: only the newest was uploaded
    assert names[-1] == "ckpt-00000150.pt"


def test_the_checkpoint_root_option_is_declared_and_empty_by_default():
    from airflow_quota_provider.get_provider_info import get_provider_info

    option = get_provider_info()["config"]["quota"]["options"]["checkpoint_root"]
    assert (option["type"], option["default"]) == ("string", "")
