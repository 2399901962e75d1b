"""The quota arguments of QuotaTrainingOperator and ``@task.quota``: their validation and the
``BaseOperator`` arguments they map to, at DAG parse time.

A quota task is placed on a quota (its Airflow pool), asks for ``gpus`` GPUs on each of ``nodes``
hosts (``gpus`` x ``nodes`` is its ``pool_slots``: the quota counts every node's GPUs) at a
``priority`` (its ``priority_weight``, with ``weight_rule="absolute"``) and is routed to the
QuotaExecutor (``executor="quota"``). Its other settings travel in ``executor_config["quota"]``
(:class:`~airflow_quota_provider.protocol.QuotaTaskConfig`), with ``gpus`` and ``nodes`` for a job
on more than one host, so that the executor can tell the GPUs per host from the total, and
``gpu_type`` when the task asks for GPU types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from airflow_quota_provider.protocol import EXECUTOR_CONFIG_KEY, MAX_NODES, QuotaTaskConfig, gpu_types

#: Executor alias the tasks are routed to; configure ``[core] executor`` with
#: ``quota:airflow_quota_provider.executors.quota_executor.QuotaExecutor``.
DEFAULT_EXECUTOR = "quota"

_QUOTA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class QuotaTaskArgumentError(ValueError):
    """A quota task argument is invalid; ``str(e)`` names the field and what is allowed."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def check_int(
    field_name: str, value: Any, *, minimum: int, maximum: int | None = None, allow_none: bool = False
) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
        allowed = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
        raise QuotaTaskArgumentError(field_name, f"{value!r} is not {allowed}" + (" or None" if allow_none else ""))
    return value


def positive_seconds(field_name: str, value: Any) -> float | None:
    """A duration argument (``grace_period``, ``expected_runtime``) in seconds: > 0, or None."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise QuotaTaskArgumentError(field_name, f"{value!r} is not a number of seconds > 0, a timedelta or None")
    return float(value)


def check_gpu_type(value: Any) -> tuple[str, ...]:
    """``gpu_type``: a GPU type, or a list of them in order of preference; None: any type."""
    return gpu_types("gpu_type", value, lambda name, v, allowed: QuotaTaskArgumentError(name, f"{v!r} is not {allowed} or None"))


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
    nodes: int = 1,
    gpu_type: str | Sequence[str] | None = None,
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
    check_int("gpus", gpus, minimum=1)
    check_int("nodes", nodes, minimum=1, maximum=MAX_NODES)
    check_int("priority", priority, minimum=0)
    check_int("max_preemptions", max_preemptions, minimum=0, allow_none=True)
    types = check_gpu_type(gpu_type)
    grace_period_s = positive_seconds("grace_period", grace_period)
    if not isinstance(preemptible, bool):
        raise QuotaTaskArgumentError("preemptible", f"{preemptible!r} is not True or False")
    if executor is not None and (not isinstance(executor, str) or not executor):
        raise QuotaTaskArgumentError("executor", f"{executor!r} is not an executor name or None")

    mapped = {"pool": quota, "pool_slots": gpus * nodes, "priority_weight": priority, "weight_rule": "absolute"}
    # the quota arguments each one follows from, as (their names, their values)
    slots = ("gpus", f"gpus={gpus!r}") if nodes == 1 else ("gpus and nodes", f"gpus={gpus!r} x nodes={nodes!r}")
    source = {
        "pool": ("quota", f"quota={quota!r}"),
        "pool_slots": slots,
        "priority_weight": ("priority", f"priority={priority!r}"),
    }
    for name, value in mapped.items():
        given = kwargs.get(name)
        if given is not None and given != value:
            if name not in source:
                raise QuotaTaskArgumentError(
                    name, f"{given!r} is not allowed; quota tasks use 'absolute' (priority is the weight)"
                )
            names, values = source[name]
            raise QuotaTaskArgumentError(name, f"{given!r} conflicts with {values}; set {names} only")

    extras = QuotaTaskConfig(
        preemptible=preemptible,
        max_preemptions=max_preemptions,
        grace_period_s=grace_period_s,
        # None: the executor estimates it from the task's history
        expected_runtime_s=positive_seconds("expected_runtime", expected_runtime),
        # only for a gang, so that a job on one host stores what it always did
        gpus=gpus if nodes > 1 else None,
        nodes=nodes if nodes > 1 else None,
        gpu_type=types,
    ).to_dict()
    executor_config = kwargs.get("executor_config") or {}
    if not isinstance(executor_config, Mapping):
        raise QuotaTaskArgumentError("executor_config", f"{executor_config!r} is not a dict or None")
    if executor_config.get(EXECUTOR_CONFIG_KEY, extras) != extras:
        raise QuotaTaskArgumentError(
            f"executor_config.{EXECUTOR_CONFIG_KEY}",
            "is set by the quota arguments (preemptible, max_preemptions, grace_period, expected_runtime, gpu_type); "
            "remove it",
        )
    return {
        **kwargs,
        **mapped,
        "executor": executor,
        "executor_config": {**executor_config, EXECUTOR_CONFIG_KEY: extras},
    }


_QUOTA_ARG_DEFAULTS: dict[str, Any] = {
    "gpus": 1,
    "nodes": 1,
    "priority": 0,
    "preemptible": True,
    "max_preemptions": None,
    "grace_period": None,
    "expected_runtime": None,
    "gpu_type": None,
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
