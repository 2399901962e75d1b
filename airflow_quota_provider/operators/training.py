"""Run a training command on a shared GPU quota, and turn preemption into a reschedule.

A task of this operator is placed on a quota (its Airflow pool), asks for ``gpus`` GPUs (its
``pool_slots``) at a ``priority`` (its ``priority_weight``, with ``weight_rule="absolute"``) and is
routed to the QuotaExecutor (``executor="quota"``). Per-task extras travel in
``executor_config["quota"]`` = ``{"preemptible", "max_preemptions", "grace_period_s"}``.

The contract with the executor, which launches the task process:

- it sets ``CUDA_VISIBLE_DEVICES`` (the GPUs handed out), ``QUOTA_JOB_ID``,
  ``QUOTA_PREEMPTION_COUNT`` (times this task was preempted so far), ``QUOTA_GRACE_PERIOD_S``
  and ``QUOTA_PREEMPT_FILE`` (a path that does not exist while the task may run);
- to preempt, it writes ``QUOTA_PREEMPT_FILE`` (JSON ``{"reason", "preemptor", "deadline"}``,
  ``deadline`` in seconds since the epoch) and may also send SIGTERM to the task process. The
  file is the signal: SIGTERM without it is an ordinary kill. Past the task's preemption limit the
  notice also carries ``"fail": true`` and a ``"message"``: the command is stopped the same way,
  then the task fails with that message (``AirflowFailException``, no retry).

The operator runs ``command`` in its own process group with ``QUOTA_CHECKPOINT_DIR`` (this
attempt's own directory), ``QUOTA_RESUME_FROM`` (the checkpoint it resumes from, or empty) and
``QUOTA_PREEMPTION_COUNT``, polls
the preempt file every half second and, when it appears, sends SIGTERM to the command, waits up to
the grace period for it to write a checkpoint and exit, then SIGKILLs what is left. It then renames
the preempt file to ``<file>.handled`` and raises ``AirflowRescheduleException``: the task instance
goes to ``UP_FOR_RESCHEDULE`` and runs again with the same ``try_number`` (no retry consumed).
Verified in Airflow 3.3.2: the Task SDK runner maps that exception to a ``RescheduleTask`` message
for any operator, not only sensors, and the scheduler does not increment ``try_number`` for a task
instance that was ``UP_FOR_RESCHEDULE``.

Checkpoints follow the job. A rescheduled run may start on another GPU host, so its checkpoint
directory must be shared. ``[quota] checkpoint_root`` (empty by default) names where the
checkpoint directories of all task instances live; a task instance's is
``<checkpoint_root>/<dag_id>/<run_id>/<task_id>[/<map_index>]``. Without it the directory is
``[quota] state_dir/checkpoints/...`` on the worker's own disk. The root, like a task's
``checkpoint_dir``, is a local path, a ``file://`` URL or any URL that Airflow's
``ObjectStoragePath`` reads (``s3://bucket/ckpt``, ``s3://conn_id@bucket/ckpt``, ``gs://...``):

- a local path or ``file://`` URL (a shared mount: NFS, Lustre, EFS...) is used directly: the
  command reads and writes ``QUOTA_CHECKPOINT_DIR`` = that directory;
- an object store is mirrored (:class:`CheckpointSync`): before the command starts, the newest
  checkpoint in the store is downloaded into a fresh local working directory under
  ``[quota] state_dir/checkpoint-sync/``, which is ``QUOTA_CHECKPOINT_DIR``, and
  ``QUOTA_RESUME_FROM`` names that local copy; after the command exits, whether it succeeded,
  failed or was preempted, the checkpoints it wrote there are uploaded (after a preemption only the
  newest one, within what is left of the grace period) and the working directory is removed.
  Checkpoints reach the store only when the command has exited.

Checkpoints are fenced per attempt (:func:`claim_attempt`): each run of the command writes to a
directory of its own, ``attempt-<n>`` in the task instance's, and resumes from the newest checkpoint
of the newest attempt before it that wrote one (:func:`latest_checkpoint`), so that a run given up
on a lost host that still writes can neither overwrite nor become the resume point of a newer one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowRescheduleException

from airflow_quota_provider.protocol import (
    DEFAULT_GRACE_PERIOD_S,
    EXECUTOR_CONFIG_KEY,
    ENV_CHECKPOINT_DIR,
    ENV_PREEMPTION_COUNT,
    ENV_RESUME_FROM,
    PreemptionNotice,
    QuotaTaskConfig,
    TaskEnvironment,
    acknowledge_notice,
    epoch_seconds,
    read_notice,
)

if TYPE_CHECKING:
    from airflow.sdk import Context, ObjectStoragePath

#: Executor alias the tasks are routed to; configure ``[core] executor`` with
#: ``quota:airflow_quota_provider.executors.quota_executor.QuotaExecutor``.
DEFAULT_EXECUTOR = "quota"
POLL_INTERVAL_S = 0.5
#: Stop this long before the executor's deadline, so the task still reports the reschedule itself.
DEADLINE_MARGIN_S = 1.0
#: Checkpoint names ending so (or starting with ``.``) are writes in progress, never resumed from.
IN_PROGRESS_SUFFIXES = (".tmp", ".partial")
#: A task instance's checkpoint directory holds one directory per attempt (a run of the command).
ATTEMPT_DIR = re.compile(r"^attempt-(\d+)$")
#: In an attempt's directory: the checkpoint it resumed from, relative to the task instance's directory.
RESUMED_FROM_FILE = ".resumed-from"
#: URL schemes of the local filesystem: such a checkpoint root is used in place, not synced.
LOCAL_SCHEMES = ("file", "local")

_QUOTA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PR_SET_PDEATHSIG = 1


class QuotaTaskArgumentError(ValueError):
    """A quota task argument is invalid; ``str(e)`` names the field and what is allowed."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


class QuotaPreempted(BaseException):
    """
    Raised inside a ``@task.quota`` callable when the executor preempts the task.

    It derives from ``BaseException`` (like ``KeyboardInterrupt``) so that a training loop's
    ``except Exception`` does not swallow it; ``finally`` blocks still run, which is where a
    checkpoint can be written. Whatever the callable does afterwards, the run is rescheduled.
    """

    def __init__(self, notice: PreemptionNotice) -> None:
        super().__init__(f"preempted ({notice.reason}) by {notice.preemptor or 'the quota executor'}")
        self.notice = notice


# --------------------------------------------------------------------------------------------
# Arguments shared by the operator and the decorator


def _check_int(field_name: str, value: Any, *, minimum: int, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = f"an integer >= {minimum}" + (" or None" if allow_none else "")
        raise QuotaTaskArgumentError(field_name, f"{value!r} is not {allowed}")
    return value


def _positive_seconds(field_name: str, value: Any) -> float | None:
    """A duration argument (``grace_period``, ``expected_runtime``) in seconds: > 0, or None."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise QuotaTaskArgumentError(field_name, f"{value!r} is not a number of seconds > 0, a timedelta or None")
    return float(value)


def quota_operator_kwargs(
    *,
    quota: str,
    gpus: int,
    priority: int,
    preemptible: bool,
    max_preemptions: int | None,
    grace_period: float | timedelta | None,
    executor: str | None,
    kwargs: dict[str, Any],
    expected_runtime: float | timedelta | None = None,
) -> dict[str, Any]:
    """
    Validate the quota arguments and return the ``BaseOperator`` keyword arguments they map to.

    ``kwargs`` are the caller's other ``BaseOperator`` arguments; they are returned merged, and a
    ``pool``, ``pool_slots``, ``priority_weight`` or ``weight_rule`` that disagrees with the quota
    arguments is an error (they are the same setting under Airflow's name).
    """
    if not isinstance(quota, str) or not _QUOTA_NAME.match(quota):
        raise QuotaTaskArgumentError(
            "quota", f"{quota!r} is not a quota name (letters, digits, '_', '.', '-'; the quota's pool name)"
        )
    _check_int("gpus", gpus, minimum=1)
    _check_int("priority", priority, minimum=0)
    _check_int("max_preemptions", max_preemptions, minimum=0, allow_none=True)
    grace_period_s = _positive_seconds("grace_period", grace_period)
    if not isinstance(preemptible, bool):
        raise QuotaTaskArgumentError("preemptible", f"{preemptible!r} is not True or False")
    if executor is not None and (not isinstance(executor, str) or not executor):
        raise QuotaTaskArgumentError("executor", f"{executor!r} is not an executor name or None")

    mapped = {"pool": quota, "pool_slots": gpus, "priority_weight": priority, "weight_rule": "absolute"}
    source = {"pool": "quota", "pool_slots": "gpus", "priority_weight": "priority", "weight_rule": None}
    for name, value in mapped.items():
        given = kwargs.get(name)
        if given is not None and given != value:
            if source[name] is None:
                raise QuotaTaskArgumentError(
                    name, f"{given!r} is not allowed; quota tasks use 'absolute' (priority is the weight)"
                )
            raise QuotaTaskArgumentError(
                name, f"{given!r} conflicts with {source[name]}={value!r}; set {source[name]} only"
            )

    extras = QuotaTaskConfig(
        preemptible=preemptible,
        max_preemptions=max_preemptions,
        grace_period_s=grace_period_s,
        # None: the executor estimates it from the task's history
        expected_runtime_s=_positive_seconds("expected_runtime", expected_runtime),
    ).to_dict()
    executor_config = kwargs.get("executor_config") or {}
    if not isinstance(executor_config, Mapping):
        raise QuotaTaskArgumentError("executor_config", f"{executor_config!r} is not a dict or None")
    if executor_config.get(EXECUTOR_CONFIG_KEY, extras) != extras:
        raise QuotaTaskArgumentError(
            f"executor_config.{EXECUTOR_CONFIG_KEY}",
            "is set by the quota arguments (preemptible, max_preemptions, grace_period, expected_runtime); remove it",
        )
    return {
        **kwargs,
        **mapped,
        "executor": executor,
        "executor_config": {**executor_config, EXECUTOR_CONFIG_KEY: extras},
    }


_QUOTA_ARG_DEFAULTS: dict[str, Any] = {
    "gpus": 1,
    "priority": 0,
    "preemptible": True,
    "max_preemptions": None,
    "grace_period": None,
    "expected_runtime": None,
}


def quota_partial_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """
    Add the ``BaseOperator`` arguments of the quota arguments in ``kwargs`` at parse time.

    For ``.partial(...)`` and ``@task.quota(...)``: a mapped task is only constructed (and
    ``__init__`` run) when it is unmapped on the worker, but the scheduler and the executor need its
    pool, pool_slots, priority_weight and executor_config before that. The quota arguments must
    therefore be given to ``partial()``/the decorator, not to ``expand()``.
    """
    if "quota" not in kwargs:
        raise QuotaTaskArgumentError("quota", "is required (the quota the task runs on); give it to partial()")
    quota_args = {name: kwargs.get(name, default) for name, default in _QUOTA_ARG_DEFAULTS.items()}
    others = {k: v for k, v in kwargs.items() if k not in _QUOTA_ARG_DEFAULTS and k not in ("quota", "executor")}
    mapped = quota_operator_kwargs(
        quota=kwargs["quota"],
        executor=kwargs.get("executor", DEFAULT_EXECUTOR),
        kwargs=others,
        **quota_args,
    )
    return {**mapped, "quota": kwargs["quota"], **{k: kwargs[k] for k in _QUOTA_ARG_DEFAULTS if k in kwargs}}


# --------------------------------------------------------------------------------------------
# Run-time side: preemption notices, checkpoints, the environment


def _is_checkpoint_name(name: str) -> bool:
    return bool(name) and not name.startswith(".") and not name.endswith(IN_PROGRESS_SUFFIXES)


def latest_checkpoint(checkpoint_dir: Path | ObjectStoragePath | str) -> Path | ObjectStoragePath | None:
    """
    The checkpoint that a next attempt of the task instance whose checkpoints live in
    ``checkpoint_dir`` resumes from: the newest checkpoint of its newest attempt that wrote one
    (:func:`claim_attempt`), never one that an older attempt wrote after a newer one started; in a
    directory without attempts, its newest checkpoint.

    The newest checkpoint of a directory is the entry modified last, ties broken by name. An entry
    is a file or a directory directly in it. Names starting with ``.`` or ending in
    ``.tmp``/``.partial`` are in-progress writes and are ignored; scripts should write a temporary
    name and ``os.replace`` it into place.

    ``checkpoint_dir`` is a local path, or a URL as :func:`checkpoint_location` reads it (a
    ``file://`` URL is a local path). In an object store, an entry's modification time is the time
    the store says its object was last written (S3 ``LastModified``, GCS ``updated``, Azure
    ``last_modified``, else the filesystem's ``modified()``), that is, when it was uploaded, not when
    the command wrote it; a directory entry (a prefix) is as new as its newest object. Stores keep
    these times to the second or so, and :class:`CheckpointSync` uploads a run's checkpoints oldest
    first, so a run's checkpoints keep their order unless several land in one tick, where the name
    decides: name checkpoints so that they sort in the order they are written (``ckpt-00000150.pt``).
    Returns a ``Path`` for a local directory, an ``ObjectStoragePath`` for an object store.
    """
    location = checkpoint_dir if isinstance(checkpoint_dir, Path) else checkpoint_location(checkpoint_dir)
    return _resolve(location, _resume_point(location, _entries(location)))


def claim_attempt(
    checkpoint_dir: Path | ObjectStoragePath,
) -> tuple[Path | ObjectStoragePath, Path | ObjectStoragePath | None]:
    """
    Start a new attempt of the task instance whose checkpoints live in ``checkpoint_dir``: return
    the directory of its own it writes its checkpoints to, ``attempt-<n>`` (one more than the newest
    there), and the checkpoint it resumes from (:func:`latest_checkpoint`, recorded in that
    directory). An attempt that was given up (its host lost, say) but still runs somewhere writes
    only to its own directory: it can neither overwrite a newer attempt's checkpoints nor become
    the resume point of any attempt that starts after the newer one did.
    """
    while True:
        entries = _entries(checkpoint_dir)
        attempts = _attempts(entries)
        number = int(ATTEMPT_DIR.match(attempts[0])[1]) + 1 if attempts else 1
        resume = _resume_point(checkpoint_dir, entries)
        attempt = checkpoint_dir / f"attempt-{number:05d}"
        if not isinstance(checkpoint_dir, Path):
            # A store has no exclusive create, and needs none: two attempts of one task instance
            # never start at once (a stale one is long started when the next one claims).
            (attempt / RESUMED_FROM_FILE).write_text(resume or "")
            return attempt, _resolve(checkpoint_dir, resume)
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        claim = Path(tempfile.mkdtemp(prefix=".attempt-", dir=checkpoint_dir))
        (claim / RESUMED_FROM_FILE).write_text(resume or "")
        try:
            claim.rename(attempt)  # atomic, and refused when that attempt exists (it is never empty)
            return attempt, _resolve(checkpoint_dir, resume)
        except OSError as e:
            shutil.rmtree(claim, ignore_errors=True)
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise


def _attempts(entries: Mapping[str, _StoreEntry]) -> list[str]:
    """The attempt directories among ``entries``, newest first."""
    names = [name for name, entry in entries.items() if entry.is_dir and ATTEMPT_DIR.match(name)]
    return sorted(names, key=lambda name: int(ATTEMPT_DIR.match(name)[1]), reverse=True)


def _newest(entries: Mapping[str, _StoreEntry]) -> str | None:
    """The name of the newest checkpoint among ``entries`` (not an attempt's directory)."""
    names = [name for name in entries if _is_checkpoint_name(name) and not ATTEMPT_DIR.match(name)]
    return max(names, key=lambda name: (entries[name].mtime, name)) if names else None


def _resume_point(checkpoint_dir: Path | ObjectStoragePath, entries: Mapping[str, _StoreEntry]) -> str | None:
    """:func:`latest_checkpoint`, relative to ``checkpoint_dir`` (whose entries are ``entries``)."""
    for name in _attempts(entries):
        inside = _entries(checkpoint_dir / name)
        if (newest := _newest(inside)) is not None:
            return f"{name}/{newest}"
        if RESUMED_FROM_FILE in inside:  # wrote none: it resumes the chain where it took it up
            return (checkpoint_dir / name / RESUMED_FROM_FILE).read_text().strip() or None
        # Neither: an attempt that died as it was claimed; the one before it is the chain's end.
    return _newest(entries)


def _resolve(
    checkpoint_dir: Path | ObjectStoragePath, relative: str | None
) -> Path | ObjectStoragePath | None:
    return checkpoint_dir.joinpath(*relative.split("/")) if relative else None


def checkpoint_location(
    spec: str | os.PathLike | ObjectStoragePath, *, field_name: str = "checkpoint_dir"
) -> Path | ObjectStoragePath:
    """
    Where checkpoints live: a ``Path`` for a local path or a ``file://`` URL, else an ``ObjectStoragePath``.

    ``spec`` is a path or a URL (``s3://bucket/prefix``; ``s3://conn_id@bucket/prefix`` names the
    Airflow connection, as ``ObjectStoragePath`` reads it). ``field_name`` names the setting in errors.
    """
    from airflow.sdk import ObjectStoragePath

    if isinstance(spec, ObjectStoragePath):
        return Path(spec.path) if spec.protocol in ("", *LOCAL_SCHEMES) else spec
    text = os.fspath(spec) if isinstance(spec, str | os.PathLike) else None
    if not isinstance(text, str) or not text.strip():
        raise QuotaTaskArgumentError(field_name, f"{spec!r} is not a path or a URL")
    if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text):
        return Path(text)
    url = urlsplit(text)
    if url.scheme.lower() in LOCAL_SCHEMES:
        if url.netloc not in ("", "localhost") or not url.path.startswith("/"):
            raise QuotaTaskArgumentError(
                field_name, f"{text!r} is not a local file URL; write file:///absolute/path"
            )
        return Path(unquote(url.path))
    try:
        return ObjectStoragePath(text)
    except ValueError as e:  # universal_pathlib knows no fsspec filesystem for the scheme
        raise QuotaTaskArgumentError(
            field_name, f"{text!r}: no filesystem for {url.scheme}:// ({e}); install the package that provides it"
        ) from e


def _safe_component(part: str) -> str:
    """
    One path component from a dag, run or task id: characters outside ``[A-Za-z0-9_.+=-]`` become
    ``_`` (as ever). ``.`` and ``..`` would name this directory or its parent, and an empty part
    would vanish, so that two task instances would share a directory: they get a ``~`` in front,
    a character the substitution never leaves, so they cannot collide with any other component.
    """
    safe = re.sub(r"[^A-Za-z0-9_.+=-]", "_", part)
    return f"~{safe}" if safe in ("", ".", "..") else safe


def _task_instance_parts(context: Context) -> list[str]:
    ti = context["ti"]
    return _parts(ti.dag_id, ti.run_id, ti.task_id, ti.map_index)


def _parts(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> list[str]:
    parts = [dag_id, run_id, task_id]
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index))
    return [_safe_component(str(part)) for part in parts]


def _state_dir() -> str:
    from airflow.sdk.configuration import conf

    return conf.get("quota", "state_dir", fallback="") or os.path.join(
        os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"), "quota"
    )


def _default_checkpoint_dir(context: Context) -> Path | ObjectStoragePath:
    ti = context["ti"]
    return default_checkpoint_dir(ti.dag_id, ti.run_id, ti.task_id, ti.map_index)


def default_checkpoint_dir(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> Path | ObjectStoragePath:
    """
    ``<[quota] checkpoint_root>/<dag_id>/<run_id>/<task_id>[/<map_index>]``; without a root,
    ``[quota] state_dir/checkpoints/...`` on this worker's disk. The executor reads the same place
    for the time of a running job's last checkpoint.
    """
    from airflow.sdk.configuration import conf

    parts = _parts(dag_id, run_id, task_id, map_index)
    root = (conf.get("quota", "checkpoint_root", fallback="") or "").strip()
    if not root:
        return Path(_state_dir(), "checkpoints", *parts)
    location = checkpoint_location(root, field_name="[quota] checkpoint_root")
    if isinstance(location, Path) and not location.is_absolute():
        raise QuotaTaskArgumentError(
            "[quota] checkpoint_root",
            f"{root!r} is a relative path (each worker would resolve it in its own directory); give an "
            "absolute path on shared storage, a file:// URL or an object-store URL",
        )
    return location.joinpath(*parts)


@dataclass(frozen=True)
class _StoreEntry:
    mtime: float
    is_dir: bool


def _store_entries(directory: ObjectStoragePath) -> dict[str, _StoreEntry]:
    """Every entry directly in ``directory`` of an object store, from one recursive listing."""
    fs = directory.fs
    base = fs._strip_protocol(directory.path).rstrip("/")
    try:
        found = fs.find(base, withdirs=False, detail=True)
    except FileNotFoundError:
        return {}
    entries: dict[str, _StoreEntry] = {}
    for path, info in found.items():
        path = fs._strip_protocol(path)
        if not path.startswith(f"{base}/"):
            continue
        name, _, rest = path[len(base) + 1 :].partition("/")
        mtime = _object_mtime(fs, path, info)
        known = entries.get(name)
        entries[name] = _StoreEntry(max(mtime, known.mtime) if known else mtime, bool(rest))
    return entries


def _entries(directory: Path | ObjectStoragePath) -> dict[str, _StoreEntry]:
    """Every entry directly in ``directory``, local or in an object store, with its modification time."""
    if not isinstance(directory, Path):
        return _store_entries(directory)
    entries = {}
    try:
        paths = list(directory.iterdir())
    except FileNotFoundError:
        return {}
    for path in paths:
        with contextlib.suppress(FileNotFoundError):  # removed since the listing
            st = path.stat()
            entries[path.name] = _StoreEntry(st.st_mtime_ns, stat.S_ISDIR(st.st_mode))
    return entries


def _object_mtime(fs, path: str, info: Mapping[str, Any]) -> float:
    """When the store last wrote the object at ``path``, in seconds since the epoch (0.0: unknown)."""
    for key in ("mtime", "LastModified", "last_modified", "updated"):
        if (seconds := epoch_seconds(info.get(key))) is not None:
            return seconds
    try:
        return epoch_seconds(fs.modified(path)) or 0.0
    except (NotImplementedError, OSError, ValueError, KeyError):
        return 0.0


def _local_signature(path: Path) -> tuple[int, int, int]:
    """(newest mtime in ns, total size, file count) of a file or a directory tree: what tells a change."""
    if not path.is_dir():
        st = path.stat()
        return st.st_mtime_ns, st.st_size, 1
    newest, size, count = path.stat().st_mtime_ns, 0, 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(dirpath, name))
            newest, size, count = max(newest, st.st_mtime_ns), size + st.st_size, count + 1
    return newest, size, count


class CheckpointSync:
    """
    A task instance's checkpoint directory in an object store, mirrored to a local working directory.

    The command only sees ``local``. :meth:`download_latest` claims the run's attempt in the store
    (:func:`claim_attempt`) and fetches the checkpoint it resumes from into ``local``;
    :meth:`upload_new` uploads what the command added or changed since to the attempt's own
    directory in the store. Files are
    uploaded as one object each (a put is atomic in object stores); a directory is uploaded under
    ``.<name>.partial`` and then moved into place, so that no reader resumes from half of it.
    """

    def __init__(self, remote: ObjectStoragePath, local: Path) -> None:
        self.remote = remote
        self.local = local
        self.attempt: ObjectStoragePath | None = None
        """This run's own directory in the store (``remote/attempt-<n>``), once claimed."""
        self.latest: ObjectStoragePath | None = None
        """The newest checkpoint in the store as this run knows it: downloaded, then last uploaded."""
        self.checked = False
        """Whether the store was looked at (by :meth:`download_latest`)."""
        self._baseline: dict[str, tuple[int, int, int]] = {}

    def _local_entries(self) -> dict[str, Path]:
        try:
            return {p.name: p for p in self.local.iterdir() if _is_checkpoint_name(p.name)}
        except FileNotFoundError:
            return {}

    def download_latest(self, log) -> Path | None:
        """Claim this run's attempt in the store and download the checkpoint it resumes from into
        ``local``; return the local copy, or None."""
        self.local.mkdir(parents=True, exist_ok=True)
        self.attempt, source = claim_attempt(self.remote)
        self.checked = True
        target = None
        if source is not None:
            target, partial = self.local / source.name, self.local / f".{source.name}.partial"
            started = time.monotonic()
            fs, path = source.fs, source.fs._strip_protocol(source.path)
            if fs.isdir(path):
                fs.get(path, str(partial), recursive=True)
            else:
                fs.get_file(path, str(partial))
            os.replace(partial, target)
            self.latest = source
            log.info("Downloaded checkpoint %s to %s in %.1fs", source, target, time.monotonic() - started)
        self._baseline = {name: _local_signature(p) for name, p in self._local_entries().items()}
        return target

    def upload_new(self, log, *, only_newest: bool = False) -> list[ObjectStoragePath]:
        """
        Upload the checkpoints written or changed in ``local`` since the download to this run's
        attempt in the store, oldest first, so that the newest is also the newest there;
        ``only_newest``: that one alone (after a preemption, when the grace period is short). Return
        what was uploaded.
        """
        assert self.attempt is not None, "download_latest claims the attempt first"
        changed = [
            p for name, p in self._local_entries().items() if self._baseline.get(name) != _local_signature(p)
        ]
        changed.sort(key=lambda p: (_local_signature(p)[0], p.name))
        if only_newest:
            changed = changed[-1:]
        fs = self.attempt.fs
        uploaded = []
        for path in changed:
            started = time.monotonic()
            target = self.attempt / path.name
            if path.is_dir():
                partial = fs._strip_protocol((self.attempt / f".{path.name}.partial").path)
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(partial, recursive=True)
                fs.put(str(path), partial, recursive=True)
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(fs._strip_protocol(target.path), recursive=True)
                fs.mv(partial, fs._strip_protocol(target.path), recursive=True)
            else:
                fs.put_file(str(path), fs._strip_protocol(target.path))
            self._baseline[path.name] = _local_signature(path)
            self.latest = target
            uploaded.append(target)
            log.info("Uploaded checkpoint %s to %s in %.1fs", path, target, time.monotonic() - started)
        return uploaded

    def remove_local(self) -> None:
        shutil.rmtree(self.local, ignore_errors=True)


@dataclass
class QuotaRun:
    """
    One run of a quota task as the task sees it: where to checkpoint, what to resume, and whether
    the executor asked it to stop. A ``@task.quota`` callable receives it as its ``quota`` argument.

    ``checkpoint_dir`` and ``resume_from`` are always local paths; when the checkpoints live in an
    object store, ``sync`` mirrors ``checkpoint_dir`` to it and ``sync.remote`` is the store's
    directory (see :class:`CheckpointSync`).
    """

    checkpoint_dir: Path
    resume_from: Path | None
    preemption_count: int
    grace_period_s: float
    preempt_file: Path | None
    cuda_visible_devices: str | None
    job_id: str | None = None
    notice: PreemptionNotice | None = field(default=None, repr=False)
    sync: CheckpointSync | None = field(default=None, repr=False)

    @classmethod
    def prepare(
        cls,
        *,
        checkpoint_dir: Path,
        grace_period_s: float | None,
        resume_from: Path | None = None,
        sync: CheckpointSync | None = None,
    ) -> QuotaRun:
        """
        Read the executor's environment; ``checkpoint_dir`` (created if missing) is where this run
        writes, ``resume_from`` what it resumes from (:func:`claim_attempt` gives both). With
        ``sync`` the directory is its local working copy, empty until :meth:`fetch_checkpoint`.
        """
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        env = TaskEnvironment.read(os.environ)
        return cls(
            checkpoint_dir=checkpoint_dir,
            resume_from=resume_from,
            preemption_count=env.preemption_count,
            grace_period_s=env.grace_period_s or grace_period_s or DEFAULT_GRACE_PERIOD_S,
            preempt_file=env.preempt_file,
            cuda_visible_devices=env.cuda_visible_devices,
            job_id=env.job_id,
            sync=sync,
        )

    def fetch_checkpoint(self, log) -> None:
        """With an object store: claim this run's attempt there and download the checkpoint it
        resumes from, which becomes ``resume_from``."""
        if self.sync is None:
            return
        try:
            self.resume_from = self.sync.download_latest(log)
        except Exception as e:
            self.sync.remove_local()
            raise AirflowException(
                f"Could not download the newest checkpoint from {self.sync.remote} to {self.checkpoint_dir}: {e}"
            ) from e

    def save_checkpoints(self, log, *, preempted: bool, strict: bool) -> None:
        """
        With an object store: upload what the run wrote (after a preemption only the newest
        checkpoint: the grace period is running out) and remove the working copy. ``strict``: a
        failed upload fails the task; otherwise it is logged (the run is failing or requeued anyway)
        and the working copy is kept.
        """
        if self.sync is None:
            return
        if preempted and self.notice is not None:
            left = self.stop_at(time.time()) - time.time()
            log.info("Uploading the newest checkpoint to %s (%.1fs of the grace period left)", self.sync.remote, left)
        try:
            self.sync.upload_new(log, only_newest=preempted)
        except Exception as e:
            message = f"Could not upload checkpoints from {self.checkpoint_dir} to {self.sync.remote}: {e}"
            if strict:
                raise AirflowException(message) from e
            log.exception("%s; they stay in %s", message, self.checkpoint_dir)
            return
        self.sync.remove_local()

    def newest_checkpoint(self) -> Path | ObjectStoragePath | None:
        """The checkpoint a next run would resume from: in the store, as far as this run knows it."""
        if self.sync is not None:
            return self.sync.latest
        return latest_checkpoint(self.checkpoint_dir) or self.resume_from  # wrote none: the one it resumed

    @property
    def preempt_requested(self) -> bool:
        """True once the executor has asked this run to stop (checks the preempt file)."""
        return self.poll_preemption() is not None

    def poll_preemption(self) -> PreemptionNotice | None:
        if self.notice is None and self.preempt_file is not None:
            self.notice = read_notice(self.preempt_file)
        return self.notice

    def stop_at(self, now: float) -> float:
        """When to SIGKILL (epoch seconds) if stopping began at ``now``: the grace period, capped by the deadline."""
        stop = now + self.grace_period_s
        if self.notice is not None and self.notice.deadline is not None:
            stop = min(stop, max(now, self.notice.deadline - DEADLINE_MARGIN_S))
        return stop

    def env(self) -> dict[str, str]:
        """The ``QUOTA_*`` variables a command or callable reads."""
        return {
            ENV_CHECKPOINT_DIR: str(self.checkpoint_dir),
            ENV_RESUME_FROM: str(self.resume_from) if self.resume_from else "",
            ENV_PREEMPTION_COUNT: str(self.preemption_count),
        }

    def preemption_outcome(self, log) -> AirflowRescheduleException | AirflowFailException:
        """
        Acknowledge the notice (rename the file) and build the exception that ends this run: a
        reschedule (no retry used), or a failure when the notice says the preemption limit is reached.
        """
        notice = self.notice or PreemptionNotice(reason="preempted", preemptor=None, deadline=None)
        if self.preempt_file is not None:
            acknowledge_notice(self.preempt_file)
        if notice.fail:
            message = notice.message or (
                f"preempted ({notice.reason}) after reaching the task's preemption limit (max_preemptions)"
            )
            log.error("Preempted past the preemption limit; failing: %s", message)
            return AirflowFailException(message)
        log.warning(
            "Preempted (%s) by %s: the task goes back to its quota's queue without using a retry "
            "(preemption %d); the next run resumes from %s",
            notice.reason,
            notice.preemptor or "the quota executor",
            self.preemption_count + 1,
            self.newest_checkpoint()
            or (f"the newest checkpoint in {self.sync.remote}" if self.sync and not self.sync.checked else None)
            or "the start (no checkpoint written)",
        )
        return AirflowRescheduleException(reschedule_date=datetime.now(tz=timezone.utc))


# --------------------------------------------------------------------------------------------
# The operator


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """If the task process is SIGKILLed, take the command down too (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class QuotaTaskMixin:
    """The quota arguments and the start of a run, shared by QuotaTrainingOperator and ``@task.quota``."""

    def _set_quota_args(
        self,
        *,
        quota: str,
        gpus: int,
        priority: int,
        checkpoint_dir: str | None,
        max_preemptions: int | None,
        grace_period: float | timedelta | None,
        preemptible: bool,
        expected_runtime: float | timedelta | None = None,
    ) -> None:
        if checkpoint_dir is not None and not isinstance(checkpoint_dir, str):
            raise QuotaTaskArgumentError("checkpoint_dir", f"{checkpoint_dir!r} is not a path string or None")
        self.quota = quota
        self.gpus = gpus
        self.priority = priority
        self.checkpoint_dir = checkpoint_dir
        self.max_preemptions = max_preemptions
        self.grace_period = _positive_seconds("grace_period", grace_period)
        self.preemptible = preemptible
        self.expected_runtime = _positive_seconds("expected_runtime", expected_runtime)

    def _start_run(self, context: Context, what: str) -> QuotaRun:
        """
        Read the executor's environment and find the checkpoint to resume from (downloading it
        when the checkpoints live in an object store); a notice that is already there ends the run
        at once. End the run with :meth:`QuotaRun.save_checkpoints`.
        """
        location = (
            checkpoint_location(self.checkpoint_dir) if self.checkpoint_dir else _default_checkpoint_dir(context)
        )
        if isinstance(location, Path):
            sync, (attempt, resume_from) = None, claim_attempt(location)
        else:  # claimed by fetch_checkpoint, whose errors name the store
            work = Path(_state_dir(), "checkpoint-sync", *_task_instance_parts(context))
            work.mkdir(parents=True, exist_ok=True)
            sync = CheckpointSync(location, Path(tempfile.mkdtemp(prefix="run-", dir=work)))
            attempt, resume_from = sync.local, None
        run = QuotaRun.prepare(
            checkpoint_dir=attempt, grace_period_s=self.grace_period, resume_from=resume_from, sync=sync
        )
        if run.poll_preemption() is not None:
            self.log.warning("Preempted before the %s started", what)
            if sync is not None:
                sync.remove_local()
            raise run.preemption_outcome(self.log)
        run.fetch_checkpoint(self.log)
        self.log.info(
            "Quota %s, %d GPU(s) (CUDA_VISIBLE_DEVICES=%s), priority %d; checkpoints in %s%s; resume from %s",
            self.quota,
            self.gpus,
            run.cuda_visible_devices,
            self.priority,
            run.checkpoint_dir,
            f" (synced with {sync.attempt})" if sync else "",
            run.resume_from or "(nothing: fresh start)",
        )
        return run


class QuotaTrainingOperator(QuotaTaskMixin, BaseOperator):
    """
    Run a (training) command on a shared GPU quota; a preemption becomes a reschedule, not a failure.

    :param command: shell command (a string, run by ``bash -c``) or an argv list. Templated.
    :param quota: the quota (and Airflow pool) the task runs on.
    :param gpus: GPUs the task needs (its ``pool_slots``), >= 1.
    :param priority: priority within and across quotas (its ``priority_weight``, absolute), >= 0;
        higher wins.
    :param checkpoint_dir: where the task's checkpoints live. Templated. A local path (a shared
        mount, if a rescheduled run may land on another host) or a ``file://`` URL is the command's
        ``QUOTA_CHECKPOINT_DIR``; an object-store URL (``s3://bucket/ckpt/{{ run_id }}``, or
        ``s3://conn_id@bucket/...`` to name the connection; any scheme ``ObjectStoragePath`` knows)
        is synced with a local working copy, which is then ``QUOTA_CHECKPOINT_DIR``. Default:
        ``<[quota] checkpoint_root>/<dag_id>/<run_id>/<task_id>[/<map_index>]``, and without a
        checkpoint root ``[quota] state_dir/checkpoints/...`` on the worker's disk; the same for every
        run of one task instance, so a rescheduled run finds its checkpoints.
    :param max_preemptions: times the task may be preempted before it fails; None: the quota's value.
    :param grace_period: seconds (or a timedelta) between SIGTERM and SIGKILL when preempted; None:
        the quota's value (the executor passes it as ``QUOTA_GRACE_PERIOD_S``).
    :param preemptible: False asks the executor never to preempt this task.
    :param expected_runtime: seconds (or a timedelta) a run is expected to take; None: the median of
        the task's recent successful durations, else its ``execution_timeout``. A victim expected to
        finish within its grace period is waited for instead of preempted.
    :param env: extra environment variables for the command. Templated.
    :param cwd: working directory of the command. Templated.
    :param executor: the executor alias; default ``"quota"``.

    The command sees ``CUDA_VISIBLE_DEVICES`` (its GPUs), ``QUOTA_CHECKPOINT_DIR``,
    ``QUOTA_RESUME_FROM`` (newest checkpoint or empty) and ``QUOTA_PREEMPTION_COUNT``. On SIGTERM it
    should write a checkpoint and exit. Its exit code is the task's result unless it was preempted.
    With an object store, the newest checkpoint is downloaded before the command starts and the
    checkpoints it writes are uploaded once it has exited, also when it failed or was preempted
    (then only the newest, within the grace period); a failed upload fails an otherwise successful
    run. Returns (XCom) the newest checkpoint (a local path, or the object's URL), or None.
    """

    template_fields: Sequence[str] = ("command", "checkpoint_dir", "env", "cwd")
    template_fields_renderers = {"command": "bash", "env": "json"}
    ui_color = "#d6eaf8"

    def __init__(
        self,
        *,
        command: str | Sequence[str],
        quota: str,
        gpus: int = 1,
        priority: int = 0,
        checkpoint_dir: str | None = None,
        max_preemptions: int | None = None,
        grace_period: float | timedelta | None = None,
        preemptible: bool = True,
        expected_runtime: float | timedelta | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        executor: str | None = DEFAULT_EXECUTOR,
        **kwargs: Any,
    ) -> None:
        if isinstance(command, str):
            if not command.strip():
                raise QuotaTaskArgumentError("command", "is empty; give a shell command or an argv list")
        elif not (
            isinstance(command, Sequence) and command and all(isinstance(a, str) for a in command)
        ):
            raise QuotaTaskArgumentError("command", f"{command!r} is not a string or a non-empty list of strings")
        if env is not None and not isinstance(env, Mapping):
            raise QuotaTaskArgumentError("env", f"{env!r} is not a dict of strings or None")
        quota_args = {"quota": quota, "gpus": gpus, "priority": priority, "max_preemptions": max_preemptions,
                      "grace_period": grace_period, "preemptible": preemptible,
                      "expected_runtime": expected_runtime}  # fmt: skip
        super().__init__(**quota_operator_kwargs(**quota_args, executor=executor, kwargs=kwargs))
        self._set_quota_args(checkpoint_dir=checkpoint_dir, **quota_args)
        self.command = command
        self.env = env
        self.cwd = cwd
        self._process: subprocess.Popen | None = None
        self._kill_requested = False
        self._sigterm_sent = False

    @classmethod
    def partial(cls, **kwargs: Any):
        """Like ``BaseOperator.partial``; the quota arguments must be given here, not to ``expand``."""
        return super().partial(**quota_partial_kwargs(kwargs))

    # -- execution ------------------------------------------------------------------------------

    def execute(self, context: Context) -> str | None:
        run = self._start_run(context, "command")
        try:
            returncode, preempted = self._run_command(run)
        except BaseException:
            run.save_checkpoints(self.log, preempted=run.notice is not None, strict=False)
            raise
        succeeded = returncode == 0 and not preempted and not self._kill_requested
        # Also after a failure or a preemption: the next run (here or on another host) resumes from it.
        run.save_checkpoints(self.log, preempted=preempted, strict=succeeded)
        if preempted:
            raise run.preemption_outcome(self.log)
        if self._kill_requested:
            raise AirflowException(f"Command was terminated (task killed; exit code {returncode})")
        if returncode < 0:
            raise AirflowException(f"Command was killed by signal {-returncode} ({signal.Signals(-returncode).name})")
        if returncode != 0:
            raise AirflowException(f"Command exited with code {returncode}")
        latest = run.newest_checkpoint()
        return str(latest) if latest else None

    def _run_command(self, run: QuotaRun) -> tuple[int, bool]:
        """Run the command until it exits or is stopped; return (exit code, preempted)."""
        argv = ["bash", "-c", self.command] if isinstance(self.command, str) else list(self.command)
        env = {**os.environ, **{k: str(v) for k, v in (self.env or {}).items()}, **run.env()}
        self._process = subprocess.Popen(
            argv,
            env=env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,
            preexec_fn=_die_with_parent,
        )
        self.log.info("Started command (pid %d, own process group): %s", self._process.pid, argv)
        reader = threading.Thread(target=self._log_output, args=(self._process,), daemon=True)
        reader.start()
        try:
            while True:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    returncode = self._process.wait(timeout=POLL_INTERVAL_S)
                    break
                if run.poll_preemption() is not None or self._kill_requested:
                    returncode = self._stop(run)
                    break
            # Stopped by us (poll or on_kill): an executor may write the notice and then send SIGTERM,
            # so a notice present now makes it a preemption. A command that ended on its own is not.
            return returncode, self._sigterm_sent and run.poll_preemption() is not None
        finally:
            if self._process.poll() is None:  # an exception escaped the loop
                self._signal_group(signal.SIGKILL)
                self._process.wait()
            reader.join(timeout=5)

    def _stop(self, run: QuotaRun) -> int:
        """SIGTERM the command, give it the grace period, then SIGKILL it."""
        assert self._process is not None
        notice = run.notice
        why = f"preempted ({notice.reason}) by {notice.preemptor}" if notice else "task killed"
        started = time.time()
        stop_at = run.stop_at(started)
        self.log.warning(
            "%s: sending SIGTERM to the command, grace period %.1fs", why.capitalize(), stop_at - started
        )
        if not self._sigterm_sent:
            self._signal_group(signal.SIGTERM)
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                returncode = self._process.wait(timeout=max(0.0, min(POLL_INTERVAL_S, stop_at - time.time())))
                self.log.info(
                    "Command stopped within the grace period (exit code %d after %.1fs)",
                    returncode,
                    time.time() - started,
                )
                return returncode
            if time.time() >= stop_at:
                break
            run.poll_preemption()
        self.log.warning("Command did not stop within the grace period; sending SIGKILL")
        self._signal_group(signal.SIGKILL)
        return self._process.wait()

    def _signal_group(self, sig: int) -> None:
        if self._process is None:
            return
        if sig == signal.SIGTERM:
            self._sigterm_sent = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, sig)

    def _log_output(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            self.log.info("%s", raw.decode(errors="replace").rstrip())

    def on_kill(self) -> None:
        """Forward the kill to the command now; ``execute`` then applies the grace period."""
        self._kill_requested = True
        if self._process is not None and self._process.poll() is None and not self._sigterm_sent:
            self._signal_group(signal.SIGTERM)
