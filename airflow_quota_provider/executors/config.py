"""QuotaExecutor's configuration: the quota file, the GPUs of this machine, and which launcher.

A bad quota file at start stops the scheduler with the field named; a bad edit while running keeps
the last good configuration (:meth:`QuotaConfig.reload`). Besides the policy's own checks, a quota
may not be named like an Airflow pool that the executor does not manage (:func:`pool_collisions`).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence

from airflow_quota_provider.policy import QuotaFile
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
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=index", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout
            found = [line.strip() for line in out.splitlines() if line.strip()]
            if found:
                return found, "nvidia-smi"
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("nvidia-smi failed (%s); using [quota] virtual_gpus", e)
    if virtual_gpus < 0:
        raise ValueError(f"[quota] virtual_gpus: {virtual_gpus} is negative")
    return [str(i) for i in range(virtual_gpus)], VIRTUAL_GPUS


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


def split_devices(quota_file: QuotaFile, devices: Sequence[str], path: str = "") -> dict[str, list[str]]:
    """Split one machine's devices among the quota file's job queues, in file order."""
    split: dict[str, list[str]] = {}
    start = 0
    for i, queue in enumerate(quota_file.queues):
        if start + queue.capacity > len(devices):
            raise QuotaConfigError(
                f"{path or 'quota file'}: queues[{i}].capacity: {queue.capacity} GPUs, but only "
                f"{len(devices) - start} of the launcher's {len(devices)} devices are left for it "
                "([quota] devices, nvidia-smi or [quota] virtual_gpus)"
            )
        split[queue.name] = list(devices[start : start + queue.capacity])
        start += queue.capacity
    return split


def load_config(path: str, devices: Sequence[str]) -> tuple[QuotaFile, dict[str, list[str]]]:
    """Read the quota file and split this machine's devices among its job queues (local launcher)."""
    quota_file = read_quota_file(path)
    return quota_file, split_devices(quota_file, devices, path)


class QuotaConfig:
    """The quota file in force, re-read when it changes on disk."""

    def __init__(
        self, path: str, devices: Sequence[str] | None, *, pools: Callable[[], Mapping[str, str | None] | None] = existing_pools
    ) -> None:
        """``devices`` are this machine's GPUs (local launcher), None on a fleet (hosts register);
        ``pools`` reads Airflow's pools (name -> description) that quota names must not collide with."""
        self.path = path
        self.devices = devices
        self._pools = pools
        self.quota_file = self._load()
        self.mtime = self._mtime()

    def _load(self) -> QuotaFile:
        if self.devices is None:
            quota_file = read_quota_file(self.path)
        else:
            quota_file = load_config(self.path, self.devices)[0]
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
