"""The quota file as the provider reads it: the executor, the usage API and UI, and the CLI.

Errors name ``[quota] quota_file`` or the bad field, so every reader reports a bad file the same way.
"""

from __future__ import annotations

import logging

from airflow_quota_provider.policy import PolicyError, QuotaFile, load_quota_file

log = logging.getLogger(__name__)


class QuotaConfigError(ValueError):
    """The quota file or the launcher's devices cannot be used; the message names the field."""


def read_quota_file(path: str) -> QuotaFile:
    """The quota file at ``path``; errors name ``[quota] quota_file`` or the bad field."""
    if not path:
        raise QuotaConfigError("[quota] quota_file: not set; point it at the quota file (YAML)")
    try:
        return load_quota_file(path)
    except PolicyError as e:
        raise QuotaConfigError(f"{path}: {e}") from None
    except OSError as e:
        raise QuotaConfigError(f"[quota] quota_file: cannot read {path}: {e.strerror}") from None
    except Exception as e:  # a reader bug must not stop the scheduler's cycle: the edit is refused
        log.exception("Unexpected error reading the quota file %s", path)
        raise QuotaConfigError(f"{path}: cannot be read as a quota file ({type(e).__name__})") from None


class QuotaFileUnavailable(RuntimeError):
    """``[quota] quota_file`` is unset, unreadable or invalid; the message names the setting and why."""


def configured_quota_file() -> QuotaFile:
    """The quota file named by ``[quota] quota_file``, read now (edits show up on the next call)."""
    from airflow.configuration import conf

    try:
        return read_quota_file(conf.get("quota", "quota_file", fallback=""))
    except QuotaConfigError as e:
        raise QuotaFileUnavailable(str(e)) from None
