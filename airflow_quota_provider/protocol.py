"""The contract between the QuotaExecutor and the task process it launches, in one place.

Pure Python, no Airflow import: the executor (scheduler side), the launchers (scheduler or GPU
host) and the task runtime (operator, ``@task.quota``) all read it.

1. **Per-task settings** (:class:`QuotaTaskConfig`), in ``executor_config["quota"]``
   (:data:`EXECUTOR_CONFIG_KEY`): written by ``QuotaTrainingOperator`` and ``@task.quota`` from
   their arguments, read by the executor when the task is queued. A hand-written
   ``executor_config`` may carry anything; reading it never fails on a value the executor can
   do without, and a value it cannot use raises :class:`QuotaTaskConfigError`, naming the field,
   which fails that task (see :meth:`QuotaTaskConfig.from_executor_config`).
2. **The task's environment**, set by the executor and its launcher for the task process:

   - ``CUDA_VISIBLE_DEVICES`` (executor): the GPUs handed to the job, comma-separated.
   - ``QUOTA_JOB_ID`` (executor): the job's id (``quota_job.id``), as a notice's ``preemptor``
     names a job.
   - ``QUOTA_HOST`` (executor): the GPU host the job was placed on (``local`` for the local
     launcher; empty when unknown).
   - ``QUOTA_NAME`` (executor): the quota the job runs on.
   - ``QUOTA_PREEMPTION_COUNT`` (executor): times this task instance was preempted so far.
   - ``QUOTA_GRACE_PERIOD_S`` (executor): seconds between the notice and the deadline: the task's
     ``grace_period``, else its quota's.
   - ``QUOTA_GPU_TYPE`` (executor): the GPU type the job runs on in a job queue with GPU types;
     empty in an untyped one.
   - ``QUOTA_PREEMPT_FILE`` (launcher): where the preemption notice appears; it does not exist
     while the task may run.
   - ``QUOTA_CHECKPOINT_DIR`` (operator, decorator): the directory this run writes its checkpoints
     to (an attempt's own; a local working copy when checkpoints live in an object store).
   - ``QUOTA_RESUME_FROM`` (operator, decorator): the checkpoint this run resumes from, or empty.

   The operator also passes ``QUOTA_PREEMPTION_COUNT`` on to its command.

   A multi-host job (a *gang*: ``nodes`` > 1) runs one member per node, and the executor's
   launcher sets these for every node (:class:`GangEnvironment`); a single-host job gets none of
   them, so nothing changes for it:

   - ``QUOTA_NNODES``: the gang's node count (torchrun's ``--nnodes``).
   - ``QUOTA_NODE_RANK``: this node's rank, 0 to ``QUOTA_NNODES`` - 1; node 0 is the one that runs
     under Airflow's task supervisor (torchrun's ``--node-rank``).
   - ``QUOTA_NPROC_PER_NODE``: processes to start on each node, the task's ``gpus`` (torchrun's
     ``--nproc-per-node``).
   - ``MASTER_ADDR``: node 0's host address; ``MASTER_PORT``: a free port chosen on node 0's host
     (static rendezvous: torchrun's ``--master-addr``/``--master-port``).
   - ``WORLD_SIZE``: ``QUOTA_NNODES`` x ``QUOTA_NPROC_PER_NODE``, the training processes torchrun
     starts in all.
   - ``QUOTA_RDZV_ID``: the job id; ``QUOTA_RDZV_ENDPOINT``: ``MASTER_ADDR:MASTER_PORT`` (``c10d``
     rendezvous: torchrun's ``--rdzv-id``/``--rdzv-endpoint``).

   The operator passes them on to its command unchanged (its ``env`` cannot override them).

   The other nodes (members) are not Airflow tasks: the executor starts them once node 0 has told
   it its rendered command (:class:`GangCommand`), as the XCom :data:`GANG_XCOM_KEY` of the task
   instance, and stops the gang when one of them fails (a notice with :data:`GANG_NODE_FAILED`).
3. **The preemption notice** (:class:`PreemptionNotice`): a JSON file
   ``{"reason", "preemptor", "deadline"}`` (``deadline`` in seconds since the epoch), plus
   ``"fail": true`` and a ``"message"`` past the task's preemption limit, or the reason
   :data:`GANG_NODE_FAILED` and a ``"message"`` when a member of the task's gang failed (the task
   stops as for a preemption, then fails with the message, retries allowed), written atomically to
   :data:`PREEMPT_FILE` in the launch's job directory (:func:`write_notice`). The file is the
   signal; a SIGTERM without it is an ordinary kill. The task polls it (:func:`read_notice`) and,
   once it has stopped, renames it with :data:`HANDLED_SUFFIX` (:func:`acknowledge_notice`).
4. **The default grace period** (:data:`DEFAULT_GRACE_PERIOD_S`): the quota file's, used by a task
   that runs without ``QUOTA_GRACE_PERIOD_S`` and without a ``grace_period`` of its own.
5. **Giving the GPUs back before the task process ends** (:func:`release_gpus`): a task whose GPU
   work ran in processes it started, all of them gone, writes ``{"pid": <its pid>}`` to
   :data:`RELEASED_FILE` beside ``QUOTA_PREEMPT_FILE``. The launcher then counts the GPUs free while
   that process finishes its try (a reschedule or a result sent to Airflow, the interpreter's
   exit: 0.1-0.4 s), as long as it has no child and nothing else of the launch runs; a reclaiming
   owner waits on this. A task that uses the GPUs in its own process never writes it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from airflow_quota_provider.policy.config import MAX_GRACE_PERIOD_S, Quota
from airflow_quota_provider.policy.jobs import MAX_NODES  # the policy refuses more in a decision file too

#: Key of ``executor_config`` that carries the per-task quota settings.
EXECUTOR_CONFIG_KEY = "quota"

ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ENV_JOB_ID = "QUOTA_JOB_ID"
ENV_HOST = "QUOTA_HOST"
ENV_QUOTA_NAME = "QUOTA_NAME"
ENV_PREEMPTION_COUNT = "QUOTA_PREEMPTION_COUNT"
ENV_GRACE_PERIOD_S = "QUOTA_GRACE_PERIOD_S"
ENV_GPU_TYPE = "QUOTA_GPU_TYPE"
ENV_PREEMPT_FILE = "QUOTA_PREEMPT_FILE"
ENV_CHECKPOINT_DIR = "QUOTA_CHECKPOINT_DIR"
ENV_RESUME_FROM = "QUOTA_RESUME_FROM"
# A gang's variables (GangEnvironment)
ENV_NNODES = "QUOTA_NNODES"
ENV_NODE_RANK = "QUOTA_NODE_RANK"
ENV_NPROC_PER_NODE = "QUOTA_NPROC_PER_NODE"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_RDZV_ID = "QUOTA_RDZV_ID"
ENV_RDZV_ENDPOINT = "QUOTA_RDZV_ENDPOINT"
#: Every variable a gang's node gets (:meth:`GangEnvironment.to_env`).
GANG_VARIABLES = (
    ENV_NNODES,
    ENV_NODE_RANK,
    ENV_NPROC_PER_NODE,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_WORLD_SIZE,
    ENV_RDZV_ID,
    ENV_RDZV_ENDPOINT,
)


#: The notice's file name in a launch's job directory (``<state_dir>/jobs/<job id>/``).
PREEMPT_FILE = "preempt.json"
#: Appended to the notice's path by the task once it has acted on it.
HANDLED_SUFFIX = ".handled"
#: Where a task says it no longer uses its GPUs (:func:`release_gpus`), in the launch's job directory.
RELEASED_FILE = "released.json"
#: A notice's reason when a member of the task's gang failed: node 0 stops its command and fails.
GANG_NODE_FAILED = "gang_node_failed"

#: The XCom key under which a gang's node 0 publishes its command (:meth:`GangCommand.to_dict`).
GANG_XCOM_KEY = "quota_gang"

#: The quota file's default grace period (the policy owns it; the policy never imports this module).
DEFAULT_GRACE_PERIOD_S: float = Quota.grace_period_s


# --------------------------------------------------------------------------------------------
# executor_config["quota"]

#: The largest value of the job table's INTEGER columns (``gpus``, ``priority``, ``max_preemptions``).
_INTEGER_COLUMN_MAX = 2**31 - 1
#: The integer fields of ``executor_config["quota"]``, each with its smallest and largest value. ``gpus``
#: is per host, so that a gang's ``gpus`` x ``nodes`` fits the column too.
_INTEGER_FIELDS: dict[str, tuple[int, int]] = {
    "gpus": (1, _INTEGER_COLUMN_MAX // MAX_NODES),
    "nodes": (1, MAX_NODES),
    "priority": (0, _INTEGER_COLUMN_MAX),
    "max_preemptions": (0, _INTEGER_COLUMN_MAX),
}
#: The longest quota name: the quota file's, and the job table's column.
_QUOTA_NAME_MAX = 128
#: The longest GPU type name: the quota file's, and the host and job tables' column.
_GPU_TYPE_MAX = 64


class QuotaTaskConfigError(ValueError):
    """A value in ``executor_config["quota"]`` the executor cannot use; ``str(e)`` names the field and
    what is allowed, ``field`` is its key."""

    def __init__(self, field_name: str, value: Any, allowed: str) -> None:
        # reprlib: the message fails a task and is stored with its job, whatever the length of the junk
        super().__init__(
            f'executor_config["{EXECUTOR_CONFIG_KEY}"]["{field_name}"]: {reprlib.repr(value)} is not {allowed}'
        )
        self.field = field_name


@dataclass(frozen=True)
class QuotaTaskConfig:
    """``executor_config["quota"]``: what a task asks of the executor beyond its pool, pool slots and
    priority weight. The operators write ``preemptible``, ``max_preemptions``, ``grace_period_s``
    and, when given, ``expected_runtime_s``; ``quota``, ``gpus`` and ``priority`` may be written by
    hand and then win over the pool, pool slots and priority weight.

    A multi-host job also carries ``nodes`` (> 1) and ``gpus``, written by the operators: then
    ``gpus`` is per host and the job counts ``gpus`` x ``nodes`` (its pool slots) against its quota."""

    preemptible: bool = True
    max_preemptions: int | None = None
    """None: the quota's."""
    grace_period_s: float | None = None
    """None: the quota's."""
    expected_runtime_s: float | None = None
    """None: estimated from the task's history."""
    quota: str | None = None
    gpus: int | None = None
    """Per host when ``nodes`` is set."""
    nodes: int | None = None
    """Hosts the job spans; None: 1."""
    priority: int | None = None
    gpu_type: tuple[str, ...] = ()
    """The GPU types the task accepts, in its order of preference; empty: any (a typed job queue
    gives it the first of its types with room)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON the operators store; the optional fields only when set, so that a DAG's
        serialized form does not change with fields it does not use."""
        data: dict[str, Any] = {
            "preemptible": self.preemptible,
            "max_preemptions": self.max_preemptions,
            "grace_period_s": self.grace_period_s,
        }
        for name in ("expected_runtime_s", "quota", "gpus", "nodes", "priority"):
            if (value := getattr(self, name)) is not None:
                data[name] = value
        if self.gpu_type:  # one type as the string it was given, several as a list
            data["gpu_type"] = self.gpu_type[0] if len(self.gpu_type) == 1 else list(self.gpu_type)
        return data

    @classmethod
    def from_executor_config(cls, executor_config: Any) -> QuotaTaskConfig:
        """Read a task's ``executor_config``. Tolerant as the executor has always been where it can do
        without a value: anything but a dict under the key counts as no settings, an empty quota as
        none, an expected runtime that is not a positive number as unknown, and a quota the quota
        file does not have is refused by the executor, naming the quotas.

        ``gpus``, ``nodes``, ``priority``, ``max_preemptions`` and ``grace_period_s`` are what the
        task asked for, so a value there the executor cannot use raises :class:`QuotaTaskConfigError`
        naming the field: ``gpus`` from 1 (per host), ``nodes`` from 1 to :data:`MAX_NODES`,
        ``priority`` and ``max_preemptions`` from 0, each within the job table's integers, and
        ``grace_period_s`` a finite number of seconds > 0 and at most a day; so does a ``quota`` name longer than the
        job table's 128 characters, a ``gpu_type`` other than a GPU type name or a non-empty list of
        them, and a ``preemptible`` other than true or false (``"false"`` is false). A number may be
        written as a string (``"2"`` is 2) and an integer as a whole float (``2.0``); a bool is not a
        number."""
        extras = executor_config.get(EXECUTOR_CONFIG_KEY) if isinstance(executor_config, Mapping) else None
        if not isinstance(extras, Mapping):
            extras = {}
        integers = {
            name: None if extras.get(name) is None else _integer(name, extras[name]) for name in _INTEGER_FIELDS
        }
        grace = extras.get("grace_period_s")
        return cls(
            preemptible=_flag("preemptible", extras.get("preemptible", True)),
            grace_period_s=None if grace is None else _seconds("grace_period_s", grace, MAX_GRACE_PERIOD_S),
            expected_runtime_s=positive_number(extras.get("expected_runtime_s")),
            quota=_quota(extras.get("quota")),
            gpu_type=gpu_types("gpu_type", extras.get("gpu_type"), QuotaTaskConfigError),
            **integers,
        )


def _flag(name: str, value: Any) -> bool:
    """``value`` of the yes/no field ``name``: a bool, or ``"true"``/``"false"`` as JSON or a form
    writes it; ``bool("false")`` is True, so anything else is refused rather than read as yes."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise QuotaTaskConfigError(name, value, "true or false")


def _quota(value: Any) -> str | None:
    """The quota asked for, None when empty. A name no quota file holds is left to the executor,
    which fails the task naming the quotas there are; one too long for the job table fails here."""
    if not value:
        return None
    name = str(value)
    if len(name) > _QUOTA_NAME_MAX:
        raise QuotaTaskConfigError("quota", value, f"a quota name of at most {_QUOTA_NAME_MAX} characters")
    return name


GPU_TYPE_NAME = re.compile(rf"\A[A-Za-z0-9._-]{{1,{_GPU_TYPE_MAX}}}\Z")
"""A GPU type's name, as the quota file allows it."""


def gpu_types(name: str, value: Any, error: Callable[[str, Any, str], Exception]) -> tuple[str, ...]:
    """``value`` of the GPU type field ``name``: None (any type), a type name, or a non-empty list of
    distinct names in order of preference; else ``error(name, value, allowed)`` is raised. Whether
    the job queue has those types is the executor's to say, naming its types."""
    if value is None:
        return ()
    names = [value] if isinstance(value, str) else value
    if (
        isinstance(names, list | tuple) and names and len(set(names)) == len(names)
        and all(isinstance(n, str) and GPU_TYPE_NAME.match(n) for n in names)
    ):
        return tuple(names)
    raise error(
        name, value, f"a GPU type name (letters, digits, '.', '-', '_', at most {_GPU_TYPE_MAX}) or a non-empty list of distinct ones"
    )


def _integer(name: str, value: Any) -> int:
    """``value`` of the integer field ``name``, within its range (:data:`_INTEGER_FIELDS`)."""
    number = value
    if isinstance(value, str) or (isinstance(value, float) and value.is_integer()):
        with contextlib.suppress(ValueError):  # also a string of more digits than Python converts
            number = int(value)
    minimum, maximum = _INTEGER_FIELDS[name]
    if isinstance(number, bool) or not isinstance(number, int) or not minimum <= number <= maximum:
        raise QuotaTaskConfigError(name, value, f"an integer from {minimum} to {maximum}")
    return number


def _seconds(name: str, value: Any, maximum: float) -> float:
    """``value`` of the duration field ``name``: a finite number of seconds > 0, at most ``maximum``."""
    number = value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    if (seconds := positive_number(number)) is None or seconds > maximum:
        raise QuotaTaskConfigError(name, value, f"a finite number of seconds > 0, at most {maximum:g}")
    return seconds


def positive_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite number > 0 (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range
        return None
    return number if math.isfinite(number) and number > 0 else None


# --------------------------------------------------------------------------------------------
# The task's environment


@dataclass(frozen=True)
class TaskEnvironment:
    """The executor's variables as the task reads them (:meth:`read`) and the executor writes them
    (:meth:`to_env`; the launcher adds ``QUOTA_PREEMPT_FILE``)."""

    cuda_visible_devices: str | None = None
    job_id: str | None = None
    host: str | None = None
    quota: str | None = None
    preemption_count: int = 0
    grace_period_s: float | None = None
    """None: not set, or not a number > 0."""
    gpu_type: str | None = None
    """The GPU type the job runs on; None in an untyped job queue."""
    preempt_file: Path | None = None

    def to_env(self) -> dict[str, str]:
        env = {
            ENV_CUDA_VISIBLE_DEVICES: self.cuda_visible_devices or "",
            ENV_JOB_ID: self.job_id or "",
            ENV_HOST: self.host or "",
            ENV_PREEMPTION_COUNT: str(self.preemption_count),
            ENV_QUOTA_NAME: self.quota or "",
            ENV_GPU_TYPE: self.gpu_type or "",
        }
        if self.grace_period_s is not None:
            env[ENV_GRACE_PERIOD_S] = str(float(self.grace_period_s))
        if self.preempt_file is not None:
            env[ENV_PREEMPT_FILE] = str(self.preempt_file)
        return env

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> TaskEnvironment:
        """Read ``environ`` (``os.environ``); a task started without the executor sees the defaults."""
        try:
            grace = positive_number(float(environ.get(ENV_GRACE_PERIOD_S) or "nan"))
        except ValueError:
            grace = None
        count = environ.get(ENV_PREEMPTION_COUNT, "0")
        return cls(
            cuda_visible_devices=environ.get(ENV_CUDA_VISIBLE_DEVICES),
            job_id=environ.get(ENV_JOB_ID),
            host=environ.get(ENV_HOST) or None,
            quota=environ.get(ENV_QUOTA_NAME) or None,
            preemption_count=int(count) if count.isdigit() else 0,
            grace_period_s=grace,
            gpu_type=environ.get(ENV_GPU_TYPE) or None,
            preempt_file=Path(environ[ENV_PREEMPT_FILE]) if environ.get(ENV_PREEMPT_FILE) else None,
        )


class GangEnvironmentError(ValueError):
    """A gang's variables are inconsistent; ``str(e)`` names the field, its variable and what is allowed."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name} ({_GANG_FIELDS[field_name][0]}): {message}")
        self.field = field_name


@dataclass(frozen=True)
class GangEnvironment:
    """
    What one node of a multi-host job (a gang) is told about the gang: the executor's launcher
    writes it into every node's environment (:meth:`to_env`), the task reads it (:meth:`read`).

    The same on every node but ``node_rank``. A job on one host has none (:meth:`read` gives
    None), so ``nnodes`` is at least 2.
    """

    nnodes: int
    node_rank: int
    nproc_per_node: int
    """Training processes per node: the task's ``gpus``."""
    master_addr: str
    """Node 0's host address."""
    master_port: int
    """A free port chosen on node 0's host."""
    rdzv_id: str
    """The job id (torchrun's ``--rdzv-id``)."""

    def __post_init__(self) -> None:
        _check_gang_int("nnodes", self.nnodes, 2, MAX_NODES, "a job on one host has no gang variables")
        _check_gang_int("node_rank", self.node_rank, 0, self.nnodes - 1, f"nnodes is {self.nnodes}")
        _check_gang_int("nproc_per_node", self.nproc_per_node, 1, None)
        _check_gang_int("master_port", self.master_port, 1, 65535)
        for name in ("master_addr", "rdzv_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or any(c.isspace() for c in value):
                raise GangEnvironmentError(name, f"{value!r} is not a non-empty string without whitespace")

    @property
    def world_size(self) -> int:
        """The training processes of the whole gang (``WORLD_SIZE``)."""
        return self.nnodes * self.nproc_per_node

    @property
    def rdzv_endpoint(self) -> str:
        """``MASTER_ADDR:MASTER_PORT``, as torchrun's ``--rdzv-endpoint`` takes it."""
        return f"{self.master_addr}:{self.master_port}"

    def to_env(self) -> dict[str, str]:
        return {
            ENV_NNODES: str(self.nnodes),
            ENV_NODE_RANK: str(self.node_rank),
            ENV_NPROC_PER_NODE: str(self.nproc_per_node),
            ENV_MASTER_ADDR: self.master_addr,
            ENV_MASTER_PORT: str(self.master_port),
            ENV_WORLD_SIZE: str(self.world_size),
            ENV_RDZV_ID: self.rdzv_id,
            ENV_RDZV_ENDPOINT: self.rdzv_endpoint,
        }

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> GangEnvironment | None:
        """The gang ``environ`` (``os.environ``) describes, or None without ``QUOTA_NNODES`` (a job on one
        host). Not tolerant, unlike :meth:`TaskEnvironment.read`: a node that guessed its rank or its
        master would hang or corrupt the whole gang, so a missing or malformed variable raises
        :class:`GangEnvironmentError`. ``WORLD_SIZE`` and ``QUOTA_RDZV_ENDPOINT`` follow from the others
        and are not read."""
        if not environ.get(ENV_NNODES):
            return None
        values: dict[str, Any] = {}
        for name, (variable, convert) in _GANG_FIELDS.items():
            text = environ.get(variable)
            if not text:
                every = ", ".join(GANG_VARIABLES)
                raise GangEnvironmentError(name, f"is not set, but {ENV_NNODES} is: every node of a gang gets {every}")
            try:
                values[name] = convert(text)
            except ValueError:
                raise GangEnvironmentError(name, f"{text!r} is not an integer") from None
        return cls(**values)


@dataclass(frozen=True)
class GangCommand:
    """
    Node 0's rendered command, which the executor runs on every other node of the gang, each with
    its own :class:`GangEnvironment` (node 0 publishes it as the XCom :data:`GANG_XCOM_KEY`).

    ``env`` is only what node 0's command gets beyond its host's environment: the task's ``env``
    and the run's ``QUOTA_CHECKPOINT_DIR``, ``QUOTA_RESUME_FROM`` and ``QUOTA_PREEMPTION_COUNT``.
    Never the task process's environment (it holds Airflow's tokens; an XCom is stored in the
    metadata DB and shown in the UI) and never the gang's variables (each member gets its own).
    """

    argv: list[str]
    env: dict[str, str]
    cwd: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "env": dict(self.env), "cwd": self.cwd}

    @classmethod
    def from_dict(cls, data: Any) -> GangCommand:
        """Strict, unlike a notice: a member started with a guessed command would hang or corrupt the
        gang, so anything malformed raises ValueError naming the field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{GANG_XCOM_KEY}: {reprlib.repr(data)} is not an object with argv, env and cwd")
        argv, env, cwd = data.get("argv"), data.get("env"), data.get("cwd")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"argv: {reprlib.repr(argv)} is not a non-empty list of strings")
        if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError(f"env: {reprlib.repr(env)} is not a dict of strings to strings")
        if cwd is not None and not isinstance(cwd, str):
            raise ValueError(f"cwd: {reprlib.repr(cwd)} is not a path string or None")
        return cls(argv=list(argv), env=dict(env), cwd=cwd)


#: GangEnvironment's fields: the variable each is read from, and its type.
_GANG_FIELDS: dict[str, tuple[str, Any]] = {
    "nnodes": (ENV_NNODES, int),
    "node_rank": (ENV_NODE_RANK, int),
    "nproc_per_node": (ENV_NPROC_PER_NODE, int),
    "master_addr": (ENV_MASTER_ADDR, str),
    "master_port": (ENV_MASTER_PORT, int),
    "rdzv_id": (ENV_RDZV_ID, str),
}


def _check_gang_int(name: str, value: Any, minimum: int, maximum: int | None, why: str = "") -> None:
    in_range = isinstance(value, int) and minimum <= value and (maximum is None or value <= maximum)
    if in_range and not isinstance(value, bool):
        return
    allowed = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
    raise GangEnvironmentError(name, f"{value!r} is not {allowed}" + (f" ({why})" if why else ""))


# --------------------------------------------------------------------------------------------
# The preemption notice


@dataclass(frozen=True)
class PreemptionNotice:
    """What the executor writes into ``QUOTA_PREEMPT_FILE``."""

    reason: str
    preemptor: str | None
    deadline: float | None
    """Seconds since the epoch after which the executor stops the task by force; None: unknown."""
    fail: bool = False
    """Past the preemption limit: the task must fail (with ``message``) instead of being requeued."""
    message: str | None = None
    """Why the task must fail: with ``fail``, or with the reason :data:`GANG_NODE_FAILED`."""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"reason": self.reason, "preemptor": self.preemptor, "deadline": self.deadline}
        if self.fail:
            data["fail"] = True
        if self.message is not None:
            data["message"] = self.message
        return data

    @classmethod
    def from_dict(cls, data: Any) -> PreemptionNotice:
        """Tolerant: a notice that is not (yet) a JSON object still counts, as a plain preemption."""
        if not isinstance(data, Mapping):
            data = {}
        return cls(
            reason=str(data.get("reason") or "preempted"),
            preemptor=None if data.get("preemptor") is None else str(data["preemptor"]),
            deadline=epoch_seconds(data.get("deadline")),
            fail=data.get("fail") is True,
            message=None if data.get("message") is None else str(data["message"]),
        )


def write_notice(path: Path, notice: PreemptionNotice) -> None:
    """Deliver ``notice`` at ``path``, atomically: the task never reads half of it."""
    write_atomically(path, json.dumps(notice.to_dict()))


def read_notice(path: Path) -> PreemptionNotice | None:
    """The notice at ``path``, or None while there is none. A file that cannot be read or is not
    valid JSON still counts: its existence is the signal."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        text = ""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    return PreemptionNotice.from_dict(data)


def acknowledge_notice(path: Path) -> None:
    """Mark the notice at ``path`` as acted on (renamed with :data:`HANDLED_SUFFIX`), if it is there."""
    with contextlib.suppress(OSError):
        os.replace(path, f"{path}{HANDLED_SUFFIX}")


def release_gpus(environ: Mapping[str, str]) -> Path | None:
    """Tell the launcher that this process no longer uses its GPUs and started nothing that still
    runs (see the module's docstring, 5); where it wrote, or None when started without a launcher."""
    preempt_file = environ.get(ENV_PREEMPT_FILE)
    if not preempt_file:
        return None
    path = Path(preempt_file).with_name(RELEASED_FILE)
    write_atomically(path, json.dumps({"pid": os.getpid()}))
    return path


def released_by(job_dir: Path) -> int | None:
    """The pid of the task process that released its GPUs in ``job_dir`` (:func:`release_gpus`), or None."""
    try:
        pid = json.loads((job_dir / RELEASED_FILE).read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``: a reader sees
    the whole file or none. The directory is made again if someone deleted it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def epoch_seconds(value: Any) -> float | None:
    """A time as seconds since the epoch: a number, a numeric string, an ISO 8601 string or a
    ``datetime`` (naive: UTC); None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
        with contextlib.suppress(ValueError):
            value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    return None
