"""Checkpoints follow the job: where a task instance's checkpoints live, which one a run resumes
from, and how a run's checkpoints reach an object store.

A rescheduled run may start on another GPU host, so its checkpoint directory must be shared.
``[quota] checkpoint_root`` (empty by default) names where the checkpoint directories of all task
instances live; a task instance's is ``<checkpoint_root>/<dag_id>/<run_id>/<task_id>[/<map_index>]``.
Without it the directory is ``[quota] state_dir/checkpoints/...`` on the worker's own disk. The
root, like a task's ``checkpoint_dir``, is a local path, a ``file://`` URL or any URL that
Airflow's ``ObjectStoragePath`` reads (``s3://bucket/ckpt``, ``s3://conn_id@bucket/ckpt``,
``gs://...``):

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

The executor reads the same places (:func:`default_checkpoint_dir`, :func:`latest_checkpoint`) for
the time of a running job's last checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from airflow_quota_provider.operators.arguments import QuotaTaskArgumentError
from airflow_quota_provider.protocol import epoch_seconds

if TYPE_CHECKING:
    from airflow.sdk import Context, ObjectStoragePath

#: Checkpoint names ending so (or starting with ``.``) are writes in progress, never resumed from.
IN_PROGRESS_SUFFIXES = (".tmp", ".partial")
#: A task instance's checkpoint directory holds one directory per attempt (a run of the command).
ATTEMPT_DIR = re.compile(r"^attempt-(\d+)$")
#: In an attempt's directory: the checkpoint it resumed from, relative to the task instance's directory.
RESUMED_FROM_FILE = ".resumed-from"
#: URL schemes of the local filesystem: such a checkpoint root is used in place, not synced.
LOCAL_SCHEMES = ("file", "local")


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


def task_instance_parts(context: Context) -> list[str]:
    ti = context["ti"]
    return _parts(ti.dag_id, ti.run_id, ti.task_id, ti.map_index)


def _parts(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> list[str]:
    parts = [dag_id, run_id, task_id]
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index))
    return [_safe_component(str(part)) for part in parts]


def state_dir() -> str:
    from airflow.sdk.configuration import conf

    return conf.get("quota", "state_dir", fallback="") or os.path.join(
        os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"), "quota"
    )


def task_instance_checkpoint_dir(context: Context) -> Path | ObjectStoragePath:
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
        return Path(state_dir(), "checkpoints", *parts)
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
