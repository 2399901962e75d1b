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

The operator runs ``command`` in its own process group with ``QUOTA_CHECKPOINT_DIR``,
``QUOTA_RESUME_FROM`` (the newest checkpoint in it, or empty) and ``QUOTA_PREEMPTION_COUNT``, polls
the preempt file every half second and, when it appears, sends SIGTERM to the command, waits up to
the grace period for it to write a checkpoint and exit, then SIGKILLs what is left. It then renames
the preempt file to ``<file>.handled`` and raises ``AirflowRescheduleException``: the task instance
goes to ``UP_FOR_RESCHEDULE`` and runs again with the same ``try_number`` (no retry consumed).
Verified in Airflow 3.3.2: the Task SDK runner maps that exception to a ``RescheduleTask`` message
for any operator, not only sensors, and the scheduler does not increment ``try_number`` for a task
instance that was ``UP_FOR_RESCHEDULE``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowRescheduleException

if TYPE_CHECKING:
    from airflow.sdk import Context

#: Environment the executor sets for the task process.
ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ENV_JOB_ID = "QUOTA_JOB_ID"
ENV_PREEMPTION_COUNT = "QUOTA_PREEMPTION_COUNT"
ENV_GRACE_PERIOD_S = "QUOTA_GRACE_PERIOD_S"
ENV_PREEMPT_FILE = "QUOTA_PREEMPT_FILE"
#: Environment the operator adds for the command (and the decorator for the callable).
ENV_CHECKPOINT_DIR = "QUOTA_CHECKPOINT_DIR"
ENV_RESUME_FROM = "QUOTA_RESUME_FROM"

#: Key of ``executor_config`` that carries the per-task quota extras.
EXECUTOR_CONFIG_KEY = "quota"
#: Executor alias the tasks are routed to; configure ``[core] executor`` with
#: ``quota:airflow_quota_provider.executors.quota_executor.QuotaExecutor``.
DEFAULT_EXECUTOR = "quota"
#: Grace period when neither the executor (``QUOTA_GRACE_PERIOD_S``) nor the task sets one; the
#: quota file's default.
DEFAULT_GRACE_PERIOD_S = 120.0
POLL_INTERVAL_S = 0.5
#: Stop this long before the executor's deadline, so the task still reports the reschedule itself.
DEADLINE_MARGIN_S = 1.0
HANDLED_SUFFIX = ".handled"

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


def _grace_seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise QuotaTaskArgumentError(
            "grace_period", f"{value!r} is not a number of seconds > 0, a timedelta or None"
        )
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
    grace_period_s = _grace_seconds(grace_period)
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

    extras = {"preemptible": preemptible, "max_preemptions": max_preemptions, "grace_period_s": grace_period_s}
    executor_config = kwargs.get("executor_config") or {}
    if not isinstance(executor_config, Mapping):
        raise QuotaTaskArgumentError("executor_config", f"{executor_config!r} is not a dict or None")
    if executor_config.get(EXECUTOR_CONFIG_KEY, extras) != extras:
        raise QuotaTaskArgumentError(
            f"executor_config.{EXECUTOR_CONFIG_KEY}",
            "is set by the quota arguments (preemptible, max_preemptions, grace_period); remove it",
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


@dataclass(frozen=True)
class PreemptionNotice:
    """What the executor wrote into ``QUOTA_PREEMPT_FILE``."""

    reason: str
    preemptor: str | None
    deadline: float | None
    """Seconds since the epoch after which the executor stops the task by force; None: unknown."""
    fail: bool = False
    """Past the preemption limit: the task must fail (with ``message``) instead of being requeued."""
    message: str | None = None

    @classmethod
    def read(cls, path: Path) -> PreemptionNotice | None:
        """Return the notice if the file exists. A file that is not (yet) valid JSON still counts."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError:
            text = ""
        try:
            data = json.loads(text)
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        return cls(
            reason=str(data.get("reason") or "preempted"),
            preemptor=None if data.get("preemptor") is None else str(data["preemptor"]),
            deadline=_epoch_seconds(data.get("deadline")),
            fail=data.get("fail") is True,
            message=None if data.get("message") is None else str(data["message"]),
        )


def _epoch_seconds(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
        with contextlib.suppress(ValueError):
            parsed = datetime.fromisoformat(value)
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=timezone.utc)
            return parsed.timestamp()
    return None


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """
    The newest checkpoint in ``checkpoint_dir``: the entry modified last, ties broken by name.

    Names starting with ``.`` or ending in ``.tmp``/``.partial`` are in-progress writes and are
    ignored; scripts should write a temporary name and ``os.replace`` it into place.
    """
    try:
        entries = [
            p
            for p in checkpoint_dir.iterdir()
            if not p.name.startswith(".") and not p.name.endswith((".tmp", ".partial"))
        ]
    except FileNotFoundError:
        return None
    if not entries:
        return None
    return max(entries, key=lambda p: (p.stat().st_mtime_ns, p.name))


def _default_checkpoint_dir(context: Context) -> Path:
    from airflow.sdk.configuration import conf

    root = conf.get("quota", "state_dir", fallback="") or os.path.join(
        os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"), "quota"
    )
    ti = context["ti"]
    parts = [ti.dag_id, ti.run_id, ti.task_id]
    if ti.map_index is not None and ti.map_index >= 0:
        parts.append(str(ti.map_index))
    safe = [re.sub(r"[^A-Za-z0-9_.+=-]", "_", part) for part in parts]
    return Path(root, "checkpoints", *safe)


@dataclass
class QuotaRun:
    """
    One run of a quota task as the task sees it: where to checkpoint, what to resume, and whether
    the executor asked it to stop. A ``@task.quota`` callable receives it as its ``quota`` argument.
    """

    checkpoint_dir: Path
    resume_from: Path | None
    preemption_count: int
    grace_period_s: float
    preempt_file: Path | None
    cuda_visible_devices: str | None
    job_id: str | None = None
    notice: PreemptionNotice | None = field(default=None, repr=False)

    @classmethod
    def prepare(cls, *, checkpoint_dir: Path, grace_period_s: float | None) -> QuotaRun:
        """Read the executor's environment and the checkpoint directory (created if missing)."""
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        try:
            env_grace = float(os.environ.get(ENV_GRACE_PERIOD_S) or "nan")
        except ValueError:
            env_grace = float("nan")
        count = os.environ.get(ENV_PREEMPTION_COUNT, "0")
        return cls(
            checkpoint_dir=checkpoint_dir,
            resume_from=latest_checkpoint(checkpoint_dir),
            preemption_count=int(count) if count.isdigit() else 0,
            grace_period_s=env_grace if env_grace > 0 else (grace_period_s or DEFAULT_GRACE_PERIOD_S),
            preempt_file=Path(os.environ[ENV_PREEMPT_FILE]) if os.environ.get(ENV_PREEMPT_FILE) else None,
            cuda_visible_devices=os.environ.get(ENV_CUDA_VISIBLE_DEVICES),
            job_id=os.environ.get(ENV_JOB_ID),
        )

    @property
    def preempt_requested(self) -> bool:
        """True once the executor has asked this run to stop (checks the preempt file)."""
        return self.poll_preemption() is not None

    def poll_preemption(self) -> PreemptionNotice | None:
        if self.notice is None and self.preempt_file is not None:
            self.notice = PreemptionNotice.read(self.preempt_file)
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
            with contextlib.suppress(OSError):
                os.replace(self.preempt_file, f"{self.preempt_file}{HANDLED_SUFFIX}")
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
            latest_checkpoint(self.checkpoint_dir) or "the start (no checkpoint written)",
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
    ) -> None:
        if checkpoint_dir is not None and not isinstance(checkpoint_dir, str):
            raise QuotaTaskArgumentError("checkpoint_dir", f"{checkpoint_dir!r} is not a path string or None")
        self.quota = quota
        self.gpus = gpus
        self.priority = priority
        self.checkpoint_dir = checkpoint_dir
        self.max_preemptions = max_preemptions
        self.grace_period = _grace_seconds(grace_period)
        self.preemptible = preemptible

    def _start_run(self, context: Context, what: str) -> QuotaRun:
        """Read the executor's environment; a notice that is already there ends the run at once."""
        checkpoint_dir = Path(self.checkpoint_dir) if self.checkpoint_dir else _default_checkpoint_dir(context)
        run = QuotaRun.prepare(checkpoint_dir=checkpoint_dir, grace_period_s=self.grace_period)
        if run.poll_preemption() is not None:
            self.log.warning("Preempted before the %s started", what)
            raise run.preemption_outcome(self.log)
        self.log.info(
            "Quota %s, %d GPU(s) (CUDA_VISIBLE_DEVICES=%s), priority %d; checkpoints in %s; resume from %s",
            self.quota,
            self.gpus,
            run.cuda_visible_devices,
            self.priority,
            run.checkpoint_dir,
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
    :param checkpoint_dir: where the command writes checkpoints (``QUOTA_CHECKPOINT_DIR``). Templated.
        Default: ``[quota] state_dir/checkpoints/<dag_id>/<run_id>/<task_id>[/<map_index>]``, the
        same for every run of one task instance, so a rescheduled run finds its checkpoints.
    :param max_preemptions: times the task may be preempted before it fails; None: the quota's value.
    :param grace_period: seconds (or a timedelta) between SIGTERM and SIGKILL when preempted; None:
        the quota's value (the executor passes it as ``QUOTA_GRACE_PERIOD_S``).
    :param preemptible: False asks the executor never to preempt this task.
    :param env: extra environment variables for the command. Templated.
    :param cwd: working directory of the command.
    :param executor: the executor alias; default ``"quota"``.

    The command sees ``CUDA_VISIBLE_DEVICES`` (its GPUs), ``QUOTA_CHECKPOINT_DIR``,
    ``QUOTA_RESUME_FROM`` (newest checkpoint or empty) and ``QUOTA_PREEMPTION_COUNT``. On SIGTERM it
    should write a checkpoint and exit. Its exit code is the task's result unless it was preempted.
    Returns (XCom) the newest checkpoint path, or None.
    """

    template_fields: Sequence[str] = ("command", "checkpoint_dir", "env")
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
                      "grace_period": grace_period, "preemptible": preemptible}  # fmt: skip
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
        returncode, preempted = self._run_command(run)
        if preempted:
            raise run.preemption_outcome(self.log)
        if self._kill_requested:
            raise AirflowException(f"Command was terminated (task killed; exit code {returncode})")
        if returncode < 0:
            raise AirflowException(f"Command was killed by signal {-returncode} ({signal.Signals(-returncode).name})")
        if returncode != 0:
            raise AirflowException(f"Command exited with code {returncode}")
        latest = latest_checkpoint(run.checkpoint_dir)
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
