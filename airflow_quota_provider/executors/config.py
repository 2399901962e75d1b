"""QuotaExecutor's configuration: the quota file, the GPUs of this machine, and which launcher.

A bad quota file at start stops the scheduler with the field named; a bad edit while running keeps
the last good configuration (:meth:`QuotaConfig.reload`). Besides the policy's own checks, a quota
may not be named like an Airflow pool that the executor does not manage (:func:`pool_collisions`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence

from airflow_quota_provider.policy import QuotaFile, Queue
from airflow_quota_provider.protocol import GPU_TYPE_NAME
from airflow_quota_provider.quota_file import QuotaConfigError, read_quota_file

log = logging.getLogger(__name__)

LAUNCHERS = ("local", "celery")


def state_dir() -> str:
    """``[quota] state_dir``, else ``quota`` under Airflow's home: where the scheduler's launcher and
    each GPU host's worker keep their job directories."""
    from airflow.configuration import conf

    return conf.get("quota", "state_dir", fallback="") or os.path.join(
        conf.get("core", "airflow_home", fallback=os.environ.get("AIRFLOW_HOME", ".")), "quota"
    )


VIRTUAL_GPUS = "[quota] virtual_gpus"
"""Where :func:`discover_devices` says virtual GPUs came from."""


def discover_devices(devices: str, virtual_gpus: int) -> tuple[list[str], str]:
    """The GPU indexes to hand out and where they came from.

    ``[quota] devices`` (comma-separated indexes) wins; else ``nvidia-smi``; else ``virtual_gpus``
    virtual indexes ``0..N-1`` so that quotas work on a laptop.
    """
    listed = [d.strip() for d in (devices or "").split(",") if d.strip()]
    if listed:
        if len(set(listed)) != len(listed):
            raise ValueError(f"[quota] devices: {devices!r} lists a device twice")
        return listed, "[quota] devices"
    found = nvidia_smi_gpus()
    if found:
        return list(found), "nvidia-smi"
    if virtual_gpus < 0:
        raise ValueError(f"[quota] virtual_gpus: {virtual_gpus} is negative")
    return [str(i) for i in range(virtual_gpus)], VIRTUAL_GPUS


def nvidia_smi_gpus() -> dict[str, str]:
    """Index -> model name (``NVIDIA H100 80GB HBM3``) of this machine's GPUs by ``nvidia-smi``;
    empty without it, or when it fails."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("nvidia-smi failed (%s); using [quota] virtual_gpus", e)
        return {}
    gpus = {}
    for line in out.splitlines():
        index, _, name = line.partition(",")
        if index.strip():
            gpus[index.strip()] = name.strip()
    return gpus


_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}


def gpu_type_of_model(model: str) -> str:
    """A GPU model's type name: the vendor's words (NVIDIA, Tesla, GeForce, Quadro) dropped, the words
    up to the first with a digit kept, lower case, joined by '-'; the rest (memory, form factor) goes.
    ``NVIDIA H100 80GB HBM3`` -> ``h100``, ``NVIDIA A100-SXM4-40GB`` -> ``a100``, ``NVIDIA L4`` -> ``l4``,
    ``NVIDIA RTX A6000`` -> ``rtx-a6000``, ``NVIDIA GeForce RTX 4090`` -> ``rtx-4090``."""
    words = [w for w in re.split(r"[\s-]+", model.strip().lower()) if w and w not in _VENDOR_WORDS]
    kept = []
    for word in words:
        kept.append(word)
        if any(c.isdigit() for c in word):
            break
    return "-".join(kept)


def machine_gpu_type(devices: Sequence[str], models: Mapping[str, str]) -> str | None:
    """The GPU type of ``devices`` by their models (``nvidia-smi``'s, :func:`nvidia_smi_gpus`); None
    when none of them is known there. A host holds one type: devices of several types are a
    ValueError naming them."""
    types: dict[str, list[str]] = {}
    for device in devices:
        if device in models:
            types.setdefault(gpu_type_of_model(models[device]), []).append(f"{device}: {models[device]}")
    if len(types) > 1:
        listed = "; ".join(f"{t} ({', '.join(found)})" for t, found in types.items())
        raise ValueError(
            f"this host's GPUs are of {len(types)} types, {listed}: a host holds one type, so hand out "
            "the GPUs of one (--devices of airflow quota worker, [quota] devices of the local launcher)"
        )
    return next(iter(types), None)


MANAGED_POOL = "(managed by QuotaExecutor)"
"""Ends the description of every Airflow pool QuotaExecutor made for a quota (``_sync_pools``)."""
DEFAULT_POOL = "default_pool"
"""Airflow's own pool (``Pool.DEFAULT_POOL_NAME``), whatever the database says."""


def pool_collisions(quota_file: QuotaFile, pools: Mapping[str, str | None]) -> list[str]:
    """Errors for quotas named like an Airflow pool that QuotaExecutor does not manage.

    A quota's name is its Airflow pool, and the executor gives that pool unlimited slots: a quota
    named ``default_pool``, or like a pool someone made for other tasks, would silently lift that
    pool's limit. ``pools`` maps the existing pools' names to their descriptions.
    """
    errors = []
    for i, queue in enumerate(quota_file.queues):
        for j, quota in enumerate(queue.quotas):
            if quota.name == DEFAULT_POOL:
                why = "Airflow's default pool"
            elif quota.name in pools and MANAGED_POOL not in (pools[quota.name] or ""):
                why = "an Airflow pool that QuotaExecutor does not manage"
            else:
                continue
            errors.append(
                f"queues[{i}].quotas[{j}].name: {quota.name!r} is {why}; a quota's name is its pool and "
                "QuotaExecutor would make it unlimited: rename the quota (or delete the pool)"
            )
    return errors


def existing_pools() -> dict[str, str | None] | None:
    """Name -> description of Airflow's pools; None when the database cannot say (not migrated)."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    try:
        with create_session() as session:
            return dict(session.execute(select(Pool.pool, Pool.description)).all())
    except SQLAlchemyError as e:
        log.warning("Cannot read Airflow's pools to check quota names against them: %s", e)
        return None


def local_gpu_type(devices: Sequence[str], source: str) -> str | None:
    """The type of the local launcher's GPUs: ``[quota] gpu_type``, else nvidia-smi's model of
    ``devices``; None for virtual GPUs without the setting."""
    from airflow.configuration import conf

    configured = conf.get("quota", "gpu_type", fallback="").strip()
    if configured:
        if not GPU_TYPE_NAME.match(configured):
            raise ValueError(
                f"[quota] gpu_type: {configured!r} is not a GPU type name (letters, digits, '.', '-', '_', at most 64)"
            )
        return configured
    return None if source == VIRTUAL_GPUS else machine_gpu_type(devices, nvidia_smi_gpus())


def split_devices(
    quota_file: QuotaFile, devices: Sequence[str], path: str = "", gpu_type: str | None = None
) -> dict[str, list[str]]:
    """Split one machine's devices among the quota file's job queues, in file order. The machine's
    GPUs are of one type, ``gpu_type`` (``[quota] gpu_type``): a job queue with GPU types must have
    that one only, since no other host could hold its other types."""
    split: dict[str, list[str]] = {}
    start = 0
    for i, queue in enumerate(quota_file.queues):
        _check_local_types(queue, gpu_type, f"{path or 'quota file'}: queues[{i}].capacity")
        if start + queue.capacity > len(devices):
            raise QuotaConfigError(
                f"{path or 'quota file'}: queues[{i}].capacity: {queue.capacity} GPUs, but only "
                f"{len(devices) - start} of the launcher's {len(devices)} devices are left for it "
                "([quota] devices, nvidia-smi or [quota] virtual_gpus)"
            )
        split[queue.name] = list(devices[start : start + queue.capacity])
        start += queue.capacity
    return split


def _check_local_types(queue: Queue, gpu_type: str | None, where: str) -> None:
    types = [t.name for t in queue.types]
    if not types:
        return
    if gpu_type is None:
        raise QuotaConfigError(
            f"{where}: job queue {queue.name} has GPU types ({', '.join(types)}): the local launcher needs "
            "[quota] gpu_type, the type of this machine's GPUs (else nvidia-smi's)"
        )
    if types != [gpu_type]:
        raise QuotaConfigError(
            f"{where}: job queue {queue.name} has GPU types {', '.join(types)}, but the local launcher runs on "
            f"one machine of GPU type {gpu_type} ([quota] gpu_type): give the queue only {gpu_type}, or run "
            "GPU hosts of each type ([quota] launcher = celery)"
        )


def load_config(path: str, devices: Sequence[str], gpu_type: str | None = None) -> tuple[QuotaFile, dict[str, list[str]]]:
    """Read the quota file and split this machine's devices among its job queues (local launcher)."""
    quota_file = read_quota_file(path)
    return quota_file, split_devices(quota_file, devices, path, gpu_type)


class QuotaConfig:
    """The quota file in force, re-read when it changes on disk."""

    def __init__(
        self, path: str, devices: Sequence[str] | None, *, gpu_type: str | None = None,
        pools: Callable[[], Mapping[str, str | None] | None] = existing_pools,
    ) -> None:
        """``devices`` are this machine's GPUs (local launcher), None on a fleet (hosts register), and
        ``gpu_type`` their type; ``pools`` reads Airflow's pools (name -> description) that quota names
        must not collide with."""
        self.path = path
        self.devices = devices
        self.gpu_type = gpu_type
        self._pools = pools
        self.quota_file = self._load()
        self.mtime = self._mtime()

    def _load(self) -> QuotaFile:
        if self.devices is None:
            quota_file = read_quota_file(self.path)
        else:
            quota_file = load_config(self.path, self.devices, self.gpu_type)[0]
        errors = pool_collisions(quota_file, self._pools() or {})
        if errors:
            raise QuotaConfigError(f"{self.path}: {'; '.join(errors)}")
        return quota_file

    def _mtime(self) -> float | None:
        try:
            return os.stat(self.path).st_mtime
        except OSError:
            return None

    def reload(self) -> bool:
        """Re-read the file if it changed; True when it did. Raises :class:`QuotaConfigError` for a bad
        edit, keeping the last good configuration."""
        mtime = self._mtime()
        if mtime == self.mtime:
            return False
        self.mtime = mtime
        self.quota_file = self._load()
        return True
