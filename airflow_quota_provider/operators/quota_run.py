"""One run of a quota task as the task sees it (:class:`QuotaRun`): where it checkpoints, what it
resumes from, and whether the executor asked it to stop.

The executor's side of the contract is :mod:`airflow_quota_provider.protocol`: the run reads the
task's environment, polls ``QUOTA_PREEMPT_FILE`` for the notice, and stops within the grace period
(``QUOTA_GRACE_PERIOD_S``, else the task's ``grace_period``, else the quota file's default), never
past the notice's deadline less :data:`DEADLINE_MARGIN_S`. It then acknowledges the notice and ends
as a reschedule (``AirflowRescheduleException``: the task instance goes to ``UP_FOR_RESCHEDULE``
and runs again with the same ``try_number``, no retry consumed), or, when the notice says the
preemption limit is reached, as a failure with the notice's message (``AirflowFailException``, no
retry). A notice that another node of the task's gang failed (``gang_node_failed``) stops the run
the same way, which then fails with the notice's message as any failure does (retries allowed).
Verified in Airflow 3.3.2: the Task SDK runner maps that exception to a ``RescheduleTask``
message for any operator, not only sensors, and the scheduler does not increment ``try_number`` for
a task instance that was ``UP_FOR_RESCHEDULE``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowRescheduleException

from airflow_quota_provider.operators.checkpoints import CheckpointSync, latest_checkpoint
from airflow_quota_provider.protocol import (
    DEFAULT_GRACE_PERIOD_S,
    ENV_CHECKPOINT_DIR,
    ENV_PREEMPTION_COUNT,
    ENV_RESUME_FROM,
    GANG_NODE_FAILED,
    PreemptionNotice,
    TaskEnvironment,
    acknowledge_notice,
    read_notice,
)

if TYPE_CHECKING:
    from airflow.sdk import ObjectStoragePath

#: How often the task looks for the notice.
POLL_INTERVAL_S = 0.5
#: Stop this long before the executor's deadline, so the task still reports the reschedule itself.
DEADLINE_MARGIN_S = 1.0


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

    @property
    def gang_node_failed(self) -> bool:
        """The executor stops this run because another node of its gang failed: not a preemption."""
        return self.notice is not None and self.notice.reason == GANG_NODE_FAILED

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

    def preemption_outcome(self, log) -> AirflowException:
        """
        Acknowledge the notice (rename the file) and build the exception that ends this run: a
        reschedule (no retry used); a failure without retry when the notice says the preemption
        limit is reached; an ordinary failure, which Airflow may retry, when another node of the
        task's gang failed (the gang cannot go on without it).
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
        if self.gang_node_failed:
            message = notice.message or "another node of the task's gang failed"
            log.error("Another node of the gang failed; failing: %s", message)
            return AirflowException(message)
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
