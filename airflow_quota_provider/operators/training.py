"""Run a training command on a shared GPU quota, and turn preemption into a reschedule.

:class:`QuotaTrainingOperator` takes the quota arguments (:mod:`.arguments`), starts a run
(:class:`~airflow_quota_provider.operators.quota_run.QuotaRun`: the executor's environment and
notice, as :mod:`airflow_quota_provider.protocol` defines them, and the checkpoints of
:mod:`.checkpoints`), and runs ``command`` in its own process group (:mod:`.process_group`) with
``QUOTA_CHECKPOINT_DIR`` (this attempt's own directory), ``QUOTA_RESUME_FROM`` (the checkpoint it
resumes from, or empty) and ``QUOTA_PREEMPTION_COUNT``; on a job of several hosts (``nodes``), also
the gang's variables the launcher set (``MASTER_ADDR``, ``QUOTA_NODE_RANK``, ...), unchanged. Node 0
of a gang, the only one Airflow runs, hands the executor its rendered command for the other nodes
(:class:`~airflow_quota_provider.protocol.GangCommand`, as an XCom). When the executor preempts the
task, the command gets SIGTERM and the grace period to write a checkpoint and exit, and the task
goes back to its quota's queue as ``UP_FOR_RESCHEDULE`` with the same ``try_number``; when another
node of its gang failed, the command is stopped the same way and the task fails.
:class:`QuotaTaskMixin` is what the operator shares with ``@task.quota``.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_quota_provider.operators.arguments import (
    DEFAULT_EXECUTOR,
    QuotaTaskArgumentError,
    positive_seconds,
    quota_operator_kwargs,
    quota_partial_kwargs,
)
from airflow_quota_provider.operators.checkpoints import (
    CheckpointSync,
    checkpoint_location,
    claim_attempt,
    state_dir,
    task_instance_checkpoint_dir,
    task_instance_parts,
)
from airflow_quota_provider.operators.links import QuotaJobLink, linked_by_plugin
from airflow_quota_provider.operators.process_group import CommandProcess
from airflow_quota_provider.operators.quota_run import POLL_INTERVAL_S, QuotaRun
from airflow_quota_provider.protocol import GANG_VARIABLES, GANG_XCOM_KEY, GangCommand, GangEnvironment, release_gpus

if TYPE_CHECKING:
    from airflow.sdk import Context

GANG_FAILURE_WAIT_S = 10.0
"""How long a gang's node whose command failed waits for the executor to say another node failed
first (it says so within a scheduler heartbeat or two of that node's end)."""


class QuotaTaskMixin:
    """The quota arguments, the start of a run and the "GPU quota job" link, shared by
    QuotaTrainingOperator and ``@task.quota``."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # The plugin gives our own operators the link, resolved by the api-server from the task
        # instance key. A link of the operator's own is resolved from an XCom that every run
        # writes at its end: an api-server round trip on a preempted task's way out, before the
        # host sees its GPUs free. Only a subclass the plugin cannot name needs that.
        if not linked_by_plugin(cls) and "operator_extra_links" not in cls.__dict__:
            cls.operator_extra_links = (QuotaJobLink(),)

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
        nodes: int = 1,
        gpu_type: str | Sequence[str] | None = None,
    ) -> None:
        if checkpoint_dir is not None and not isinstance(checkpoint_dir, str):
            raise QuotaTaskArgumentError("checkpoint_dir", f"{checkpoint_dir!r} is not a path string or None")
        self.quota = quota
        self.gpus = gpus
        self.nodes = nodes
        self.gpu_type = gpu_type
        self.priority = priority
        self.checkpoint_dir = checkpoint_dir
        self.max_preemptions = max_preemptions
        self.grace_period = positive_seconds("grace_period", grace_period)
        self.preemptible = preemptible
        self.expected_runtime = positive_seconds("expected_runtime", expected_runtime)

    def _start_run(self, context: Context, what: str) -> QuotaRun:
        """
        Read the executor's environment and find the checkpoint to resume from (downloading it
        when the checkpoints live in an object store); a notice that is already there ends the run
        at once. End the run with :meth:`QuotaRun.save_checkpoints`. A node of a gang whose
        variables are missing or inconsistent fails before it starts anything.
        """
        gang = GangEnvironment.read(os.environ)
        location = (
            checkpoint_location(self.checkpoint_dir) if self.checkpoint_dir else task_instance_checkpoint_dir(context)
        )
        if isinstance(location, Path):
            sync, (attempt, resume_from) = None, claim_attempt(location)
        else:  # claimed by fetch_checkpoint, whose errors name the store
            work = Path(state_dir(), "checkpoint-sync", *task_instance_parts(context))
            work.mkdir(parents=True, exist_ok=True)
            sync = CheckpointSync(location, Path(tempfile.mkdtemp(prefix="run-", dir=work)))
            attempt, resume_from = sync.local, None
        run = QuotaRun.prepare(
            checkpoint_dir=attempt, grace_period_s=self.grace_period, resume_from=resume_from, sync=sync
        )
        if run.poll_preemption() is not None:
            stopped = "Another node of the gang failed" if run.gang_node_failed else "Preempted"
            self.log.warning("%s before the %s started", stopped, what)
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
        if gang is not None:
            self.log.info(
                "Node %d of a gang of %d (%d processes in all, job %s); master %s",
                gang.node_rank,
                gang.nnodes,
                gang.world_size,
                gang.rdzv_id,
                gang.rdzv_endpoint,
            )
        return run


class QuotaTrainingOperator(QuotaTaskMixin, BaseOperator):
    """
    Run a (training) command on a shared GPU quota; a preemption becomes a reschedule, not a failure.

    :param command: shell command (a string, run by ``bash -c``) or an argv list. Templated.
    :param quota: the quota (and Airflow pool) the task runs on.
    :param gpus: GPUs the task needs on each host, >= 1.
    :param nodes: hosts the task spans, 1 to 1024 (default 1: one host). A task on several hosts (a
        gang) is started on all of them at once, its command once per host with the gang's
        variables (see below); its quota counts ``gpus`` x ``nodes`` GPUs (its ``pool_slots``).
        Node 0 is the task instance: it renders the command and publishes it, with ``env``,
        ``cwd`` and its ``QUOTA_*`` variables, as the XCom ``quota_gang``, from which the executor
        starts the other nodes; when one of them fails, node 0's command is stopped as for a
        preemption and the task fails (Airflow may retry it).
    :param gpu_type: the GPU type the task runs on (``"h100"``), or a list of them in order of
        preference, in a job queue whose capacity is per GPU type; None (default): any of the queue's
        types, the first with room in the queue's order. A type the queue lacks fails the task,
        naming the queue's types. The command sees the type it got as ``QUOTA_GPU_TYPE``.
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
    ``QUOTA_RESUME_FROM`` (newest checkpoint or empty) and ``QUOTA_PREEMPTION_COUNT``; with
    ``nodes`` > 1 also ``QUOTA_NNODES``, ``QUOTA_NODE_RANK``, ``QUOTA_NPROC_PER_NODE``,
    ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``QUOTA_RDZV_ID`` and ``QUOTA_RDZV_ENDPOINT``
    (:class:`~airflow_quota_provider.protocol.GangEnvironment`), which ``env`` cannot override. On
    SIGTERM it should write a checkpoint and exit. Its exit code is the task's result unless it was preempted.
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
        nodes: int = 1,
        gpu_type: str | Sequence[str] | None = None,
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
        quota_args = {"quota": quota, "gpus": gpus, "nodes": nodes, "gpu_type": gpu_type, "priority": priority,
                      "max_preemptions": max_preemptions, "grace_period": grace_period, "preemptible": preemptible,
                      "expected_runtime": expected_runtime}  # fmt: skip
        super().__init__(**quota_operator_kwargs(**quota_args, executor=executor, kwargs=kwargs))
        self._set_quota_args(checkpoint_dir=checkpoint_dir, **quota_args)
        self.command = command
        self.env = env
        self.cwd = cwd
        self._command_process = CommandProcess()

    @classmethod
    def partial(cls, **kwargs: Any):
        """Like ``BaseOperator.partial``; the quota arguments must be given here, not to ``expand``."""
        return super().partial(**quota_partial_kwargs(kwargs))

    # -- execution ------------------------------------------------------------------------------

    def execute(self, context: Context) -> str | None:
        run = self._start_run(context, "command")
        try:
            self._publish_gang_command(context, run)
            returncode, preempted = self._command_process.run(
                self._argv(), env=self._env(run), cwd=self.cwd, run=run, log=self.log
            )
        except BaseException:
            run.save_checkpoints(self.log, preempted=run.notice is not None, strict=False)
            raise
        succeeded = returncode == 0 and not preempted and not self._command_process.kill_requested
        # Also after a failure or a preemption: the next run (here or on another host) resumes from it.
        run.save_checkpoints(self.log, preempted=preempted, strict=succeeded)
        # The command used the GPUs, not this process: they are free while this try ends and the
        # process exits (a reclaiming owner starts sooner). The launcher checks that nothing the
        # command left runs. Not before the checkpoints are saved: the executor frees them only once
        # the try has ended, and would only look again and again while an upload runs.
        release_gpus(os.environ)
        if preempted:
            raise run.preemption_outcome(self.log)
        if self._command_process.kill_requested:
            raise AirflowException(f"Command was terminated (task killed; exit code {returncode})")
        if returncode < 0:
            failure = f"Command was killed by signal {-returncode} ({signal.Signals(-returncode).name})"
        else:
            failure = f"Command exited with code {returncode}" if returncode != 0 else None
        if failure is not None:
            if self._another_node_failed(run):  # why this node's command ended: fail naming that node
                self.log.error("%s, after another node of the gang failed", failure)
                raise run.preemption_outcome(self.log)
            raise AirflowException(failure)
        latest = run.newest_checkpoint()
        return str(latest) if latest else None

    def _another_node_failed(self, run: QuotaRun) -> bool:
        """On a gang's node whose command failed: whether another node failed first. The command
        often ends before the executor's notice arrives (its peers' connections went with that
        node), so the notice is waited for a little while, to name the node in the task's failure."""
        if GangEnvironment.read(os.environ) is None:
            return False
        deadline = time.monotonic() + GANG_FAILURE_WAIT_S
        while run.poll_preemption() is None and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S)
        return run.gang_node_failed

    def _argv(self) -> list[str]:
        return ["bash", "-c", self.command] if isinstance(self.command, str) else list(self.command)

    def _env(self, run: QuotaRun) -> dict[str, str]:
        gang = GangEnvironment.read(os.environ)
        return {**os.environ, **self._task_env(run, gang), **(gang.to_env() if gang else {})}

    def _task_env(self, run: QuotaRun, gang: GangEnvironment | None) -> dict[str, str]:
        """What the command gets beyond its host's environment and the gang's variables: ``env`` and
        the run's ``QUOTA_*``. On a gang ``env`` cannot name a gang variable: a node whose master or
        rank differs from what its peers were told hangs the whole gang."""
        own = {k: str(v) for k, v in (self.env or {}).items() if gang is None or k not in GANG_VARIABLES}
        return {**own, **run.env()}

    def _publish_gang_command(self, context: Context, run: QuotaRun) -> None:
        """On node 0 of a gang, hand the executor the command it starts on the other nodes, which are
        not Airflow tasks and so render nothing themselves (:class:`GangCommand`: never this
        process's environment, which holds Airflow's tokens)."""
        gang = GangEnvironment.read(os.environ)
        if gang is None or gang.node_rank != 0:
            return
        command = GangCommand(argv=self._argv(), env=self._task_env(run, gang), cwd=self.cwd)
        context["ti"].xcom_push(key=GANG_XCOM_KEY, value=command.to_dict())
        self.log.info(
            "Published the command for the gang's other %d node(s) as XCom %r (with %s)",
            gang.nnodes - 1,
            GANG_XCOM_KEY,
            ", ".join(sorted(command.env)),
        )

    def on_kill(self) -> None:
        """Forward the kill to the command now; ``execute`` then applies the grace period."""
        self._command_process.kill()
