"""The quota-share planner: one queue of a quota file as AWS Batch quota shares, and the changes that
make a job queue's shares match it.

Pure: it reads the quota file's types and the shares as AWS lists them, and calls nothing;
:class:`~airflow_quota_provider.hooks.batch_quota.BatchQuotaShareHook` lists the shares and applies
the plan. How a quota maps onto a quota share is :func:`quota_share_specs`; what AWS Batch cannot
express is refused with a :class:`~airflow_quota_provider.policy.PolicyError` that names the field,
rather than applied with a different meaning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_quota_provider.policy import PolicyError, Quota
from airflow_quota_provider.policy.config import DEFAULT_GANG_RESERVATION_AFTER_S

if TYPE_CHECKING:
    from airflow_quota_provider.policy import Queue

MAX_QUOTA_SHARES_PER_QUEUE = 20
"""AWS Batch's documented limit of quota shares per job queue (not in the service model)."""
MAX_CAPACITY_LIMITS_PER_SHARE = 5
"""AWS Batch's limit of capacity limits (instance types) per quota share (the model's ``capacityLimits``)."""

MANAGED_TAG = "airflow-quota-provider:managed"

_STRATEGY = {"reserve": "RESERVE", "lend": "LEND", "lend_and_borrow": "LEND_AND_BORROW"}
_IN_SHARE_PREEMPTION = {"never": "DISABLED", "lower_priority": "ENABLED"}
UNLIMITED_BORROW = -1

# Quota-file fields that only the local executor uses; a value other than the quota file's default
# is reported in the plan.
_LOCAL_ONLY = (
    "weight", "max_priority", "grace_period_s", "min_runtime_s", "spare_finishing_within_s",
    "preemption_delay_s", "on_preemption_limit",
)


@dataclass(frozen=True)
class QuotaShareSpec:
    """The quota share a quota file asks for, in AWS Batch's terms."""

    name: str
    capacity_limits: tuple[tuple[str, int], ...]  # (capacityUnit, maxCapacity)
    strategy: str
    borrow_limit: int | None  # percent, -1 = unlimited; None unless LEND_AND_BORROW
    in_share_preemption: str

    def capacity_limits_api(self) -> list[dict[str, Any]]:
        return [{"maxCapacity": cap, "capacityUnit": unit} for unit, cap in self.capacity_limits]

    def resource_sharing_api(self) -> dict[str, Any]:
        config: dict[str, Any] = {"strategy": self.strategy}
        if self.borrow_limit is not None:
            config["borrowLimit"] = self.borrow_limit
        return config

    def preemption_api(self) -> dict[str, Any]:
        return {"inSharePreemption": self.in_share_preemption}

    @classmethod
    def from_api(cls, detail: dict[str, Any]) -> QuotaShareSpec:
        """What AWS holds now, normalized so that it compares equal to an unchanged spec."""
        sharing = detail.get("resourceSharingConfiguration") or {}
        strategy = sharing.get("strategy", "")
        borrow = sharing.get("borrowLimit", UNLIMITED_BORROW) if strategy == "LEND_AND_BORROW" else None
        return cls(
            name=detail["quotaShareName"],
            capacity_limits=tuple(
                sorted((limit["capacityUnit"], limit["maxCapacity"]) for limit in detail.get("capacityLimits", []))
            ),
            strategy=strategy,
            borrow_limit=borrow,
            in_share_preemption=(detail.get("preemptionConfiguration") or {}).get("inSharePreemption", ""),
        )


def borrow_limit_percent(borrow_limit: int | None, capacity: int, path: str) -> int:
    """Our ``borrow_limit`` (capacity units above the quota's capacity) as AWS's whole percentage of it.

    AWS's ``borrowLimit`` is a percentage of ``maxCapacity`` (-1 = unlimited), so only limits that are
    a whole percentage of the capacity can be expressed; any other is refused with the nearest ones.
    """
    if borrow_limit is None:
        return UNLIMITED_BORROW
    if borrow_limit == 0:
        return 0
    if capacity == 0:
        raise PolicyError(
            path,
            f"{borrow_limit} cannot be expressed on AWS Batch: borrowLimit is a percentage of the quota's "
            "capacity, which is 0; use null (unlimited) or 0",
        )
    percent, remainder = divmod(borrow_limit * 100, capacity)
    if remainder == 0:
        return percent
    lower = next(b for b in range(borrow_limit, -1, -1) if b * 100 % capacity == 0)
    upper = next(b for b in range(borrow_limit, borrow_limit + capacity + 1) if b * 100 % capacity == 0)
    raise PolicyError(
        path,
        f"{borrow_limit} is {borrow_limit * 100 / capacity:.4g}% of the quota's capacity {capacity}; AWS Batch's "
        f"borrowLimit is a whole percentage: use {lower} ({lower * 100 // capacity}%) or "
        f"{upper} ({upper * 100 // capacity}%), or null (unlimited)",
    )


def quota_share_specs(queue: Queue, *, path: str = "queue") -> list[QuotaShareSpec]:
    """Map one quota-file queue onto AWS Batch quota shares, refusing what AWS cannot express.

    * ``capacity`` is counted in the queue's ``capacity_unit`` (an instance type such as
      ``ml.p4d.24xlarge``), AWS's ``maxCapacity``; the unit is required for this backend. A queue
      with GPU types gives each share one capacity limit per type (at most
      :data:`MAX_CAPACITY_LIMITS_PER_SHARE`), counted in the instance type that the queue's
      ``instance_types`` maps the type to (see :func:`type_capacity_limits`).
    * ``sharing`` -> ``resourceSharingConfiguration.strategy``; ``borrow_limit`` -> ``borrowLimit``
      (a whole percentage of the capacity, -1 when null; one percentage for every type).
    * ``preemption.within_quota`` -> ``inSharePreemption`` (``never`` DISABLED, ``lower_priority``
      ENABLED). AWS always reclaims lent capacity whatever the borrower's priority, which is our
      ``reclaim: any``; ``lend_limit``, ``borrow_within`` and ``lower_or_newer_equal_priority`` have no
      AWS counterpart and are refused.
    * ``cohorts`` are refused: AWS Batch quota shares are one flat list per job queue, and no
      flattening keeps what a tree guarantees (a cohort's own capacity, its limits, reclaim by level).
    """
    quotas = tuple(queue.quotas)
    if queue.cohorts:
        raise PolicyError(
            f"{path}.cohorts",
            "AWS Batch quota shares are flat: a job queue's shares cannot be grouped in cohorts; "
            "give this queue a file without cohorts for the aws-batch backend",
        )
    if len(quotas) > MAX_QUOTA_SHARES_PER_QUEUE:
        raise PolicyError(
            f"{path}.quotas",
            f"{len(quotas)} quotas; an AWS Batch job queue holds at most {MAX_QUOTA_SHARES_PER_QUEUE} quota shares",
        )
    if queue.types:
        return type_capacity_limits(queue, path=path)
    if not queue.capacity_unit:
        raise PolicyError(
            f"{path}.capacity_unit",
            "required for the aws-batch backend: the instance type that capacities count, such as ml.p4d.24xlarge",
        )
    specs = []
    for i, quota in enumerate(quotas):
        quota_path = f"{path}.quotas[{i}]"
        borrow = None
        if quota.sharing == "lend_and_borrow":
            borrow = borrow_limit_percent(quota.borrow_limit, quota.capacity, f"{quota_path}.borrow_limit")
        specs.append(_quota_share_spec(quota, ((queue.capacity_unit, quota.capacity),), borrow, quota_path))
    return specs


def type_capacity_limits(queue: Queue, *, path: str = "queue") -> list[QuotaShareSpec]:
    """The quota shares of a queue with GPU types: every share has one capacity limit per type of the
    queue (0 where the quota has none of it, so that it may still borrow that type), in the instance
    type ``instance_types`` maps it to, and one ``borrowLimit`` for all of them (:func:`_type_borrow_limit`)."""
    instance_types = queue.instance_types
    names = [gpu_type.name for gpu_type in queue.types]
    if len(names) > MAX_CAPACITY_LIMITS_PER_SHARE:
        raise PolicyError(
            f"{path}.capacity",
            f"{len(names)} GPU types ({', '.join(names)}); an AWS Batch quota share holds at most "
            f"{MAX_CAPACITY_LIMITS_PER_SHARE} capacity limits, one per instance type",
        )
    missing = [name for name in names if not instance_types.get(name)]
    if missing:
        raise PolicyError(
            f"{path}.instance_types",
            f"no instance type for GPU type(s) {', '.join(missing)}: the aws-batch backend counts each GPU type "
            "in an instance type, such as {h100: ml.p5.48xlarge, a100: ml.p4d.24xlarge}",
        )
    units = [instance_types[name] for name in names]
    shared = sorted({unit for unit in units if units.count(unit) > 1})
    if shared:
        raise PolicyError(
            f"{path}.instance_types",
            f"{', '.join(shared)} is given to several GPU types; a quota share has one capacity limit per instance type",
        )
    specs = []
    for i, quota in enumerate(queue.quotas):
        quota_path = f"{path}.quotas[{i}]"
        per_type = [gpu_type.quota(quota.name) for gpu_type in queue.types]
        borrow = None
        if quota.sharing == "lend_and_borrow":
            borrow = _type_borrow_limit(quota, dict(zip(names, per_type, strict=True)), f"{quota_path}.borrow_limit")
        limits = tuple((unit, typed.capacity) for unit, typed in zip(units, per_type, strict=True))
        specs.append(_quota_share_spec(quota, limits, borrow, quota_path))
    return specs


def _type_borrow_limit(quota: Quota, per_type: dict[str, Quota], path: str) -> int:
    """One ``borrowLimit`` for every capacity limit of a share, as AWS applies it to each.

    A percentage in the file (``borrow_limit: "50%"``) is AWS's own; a mapping must come to the same
    whole percentage of every type's capacity (a type of capacity 0 that may borrow 0 fits any) or is
    refused, naming the types that differ.
    """
    # Kept by the policy's Quota once it carries the file's percentage; else read from each type's limit.
    percent = quota.borrow_limit_percent
    if percent is not None:
        if percent != int(percent):
            raise PolicyError(path, f"{percent:g}%: AWS Batch's borrowLimit is a whole percentage")
        return int(percent)
    percents = {
        name: borrow_limit_percent(typed.borrow_limit, typed.capacity, f"{path}.{name}")
        for name, typed in per_type.items()
        if not (typed.capacity == 0 and typed.borrow_limit == 0)
    }
    distinct = set(percents.values())
    if len(distinct) > 1:
        shown = ", ".join(
            f"{name} {'unlimited' if value == UNLIMITED_BORROW else f'{value}%'}" for name, value in percents.items()
        )
        raise PolicyError(
            path,
            f"AWS Batch applies one borrowLimit percentage to every instance type of a share, but the types differ "
            f"({shown}); give the same percentage of each type's capacity, such as \"50%\"",
        )
    return distinct.pop() if distinct else 0


def _quota_share_spec(
    quota: Quota, capacity_limits: tuple[tuple[str, int], ...], borrow: int | None, path: str
) -> QuotaShareSpec:
    if quota.sharing not in _STRATEGY:
        raise PolicyError(f"{path}.sharing", f"{str(quota.sharing)!r} is not one of {', '.join(_STRATEGY)}")
    if quota.lend_limit is not None:
        raise PolicyError(
            f"{path}.lend_limit",
            "AWS Batch quota shares have no lend limit: remove it (lend all idle capacity) or use sharing: reserve",
        )
    policy = quota.preemption
    if policy.within_quota not in _IN_SHARE_PREEMPTION:
        raise PolicyError(
            f"{path}.preemption.within_quota",
            f"{str(policy.within_quota)!r} has no AWS Batch counterpart; use one of {', '.join(_IN_SHARE_PREEMPTION)}",
        )
    if quota.sharing != "reserve" and policy.reclaim != "any":
        raise PolicyError(
            f"{path}.preemption.reclaim",
            f"{str(policy.reclaim)!r}: AWS Batch always reclaims lent capacity whatever the borrower's priority; use any",
        )
    if policy.borrow_within is not None:
        raise PolicyError(
            f"{path}.preemption.borrow_within", "AWS Batch has no borrow-within preemption; remove it (null)"
        )
    return QuotaShareSpec(
        name=quota.name,
        capacity_limits=capacity_limits,
        strategy=_STRATEGY[quota.sharing],
        borrow_limit=borrow,
        in_share_preemption=_IN_SHARE_PREEMPTION[policy.within_quota],
    )


def local_only_notes(queue: Queue) -> list[str]:
    """Quota and job queue fields set in the file that AWS Batch quota shares do not carry (shown with
    the plan)."""
    notes = []
    for quota in queue.quotas:
        for name in _LOCAL_ONLY:
            value = getattr(quota, name)
            if value != getattr(Quota, name):
                shown = f"{value:g}" if isinstance(value, float) else value
                notes.append(f"{quota.name}: {name}={shown} applies to the local executor only")
        if quota.max_preemptions is not None:
            notes.append(
                f"{quota.name}: max_preemptions={quota.max_preemptions} is set per job on AWS Batch "
                "(SageMakerBatchTrainingOperator preemption_retries_before_termination)"
            )
    # AWS Batch places a job's instances itself; like the quotas' fields, only a setting of one's own is noted
    if queue.gang_reservation_after_s not in (None, DEFAULT_GANG_RESERVATION_AFTER_S):
        notes.append(f"{queue.name}: gang_reservation_after_s={queue.gang_reservation_after_s:g} applies to the local "
                     "executor only")
    return notes


@dataclass(frozen=True)
class PlannedChange:
    """One call that :meth:`~airflow_quota_provider.hooks.batch_quota.BatchQuotaShareHook.apply_plan` will make."""

    action: str  # create | update | disable | delete
    name: str
    request: dict[str, Any]
    changes: tuple[str, ...] = ()

    def describe(self) -> str:
        detail = f" ({'; '.join(self.changes)})" if self.changes else ""
        return f"{self.action:<7} {self.name}{detail}"


@dataclass(frozen=True)
class QuotaSharePlan:
    """What it takes to make a job queue's quota shares match a quota file; empty when they do."""

    job_queue: str
    changes: tuple[PlannedChange, ...]
    unchanged: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not self.changes

    def render(self) -> str:
        lines = [f"Quota shares of AWS Batch job queue {self.job_queue}:"]
        lines += [f"  {change.describe()}" for change in self.changes]
        lines += [f"  ok      {name}" for name in self.unchanged]
        if self.empty:
            lines.append("  nothing to change")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_queue": self.job_queue,
            "changes": [
                {"action": c.action, "name": c.name, "changes": list(c.changes), "request": c.request}
                for c in self.changes
            ],
            "unchanged": list(self.unchanged),
            "notes": list(self.notes),
        }


def _diff(want: QuotaShareSpec, have: QuotaShareSpec, state: str) -> tuple[dict[str, Any], list[str]]:
    request: dict[str, Any] = {}
    changes: list[str] = []
    if sorted(want.capacity_limits) != sorted(have.capacity_limits):  # AWS lists them in its own order
        request["capacityLimits"] = want.capacity_limits_api()
        changes.append(f"capacity {_fmt_limits(have)} -> {_fmt_limits(want)}")
    if (want.strategy, want.borrow_limit) != (have.strategy, have.borrow_limit):
        request["resourceSharingConfiguration"] = want.resource_sharing_api()
        changes.append(f"sharing {format_sharing(have)} -> {format_sharing(want)}")
    if want.in_share_preemption != have.in_share_preemption:
        request["preemptionConfiguration"] = want.preemption_api()
        changes.append(f"inSharePreemption {have.in_share_preemption} -> {want.in_share_preemption}")
    if state != "ENABLED":
        request["state"] = "ENABLED"
        changes.append(f"state {state} -> ENABLED")
    return request, changes


def _fmt_limits(spec: QuotaShareSpec) -> str:
    return ", ".join(f"{cap} {unit}" for unit, cap in spec.capacity_limits) or "none"


def format_sharing(spec: QuotaShareSpec) -> str:
    """The strategy and borrow limit as the plan and the usage report show them."""
    if spec.borrow_limit is None:
        return spec.strategy
    limit = "unlimited" if spec.borrow_limit == UNLIMITED_BORROW else f"{spec.borrow_limit}%"
    return f"{spec.strategy} borrowLimit {limit}"


def plan_quota_shares(
    job_queue: str, queue: Queue, shares: list[dict[str, Any]], *, path: str = "queue"
) -> QuotaSharePlan:
    """What makes the quota shares ``shares`` (as AWS lists them) of ``job_queue`` match the file's queue."""
    wanted = quota_share_specs(queue, path=path)
    existing = {share["quotaShareName"]: share for share in shares}
    removals: list[PlannedChange] = []
    updates: list[PlannedChange] = []
    creations: list[PlannedChange] = []
    unchanged: list[str] = []
    for name, share in existing.items():
        if name in {spec.name for spec in wanted} or share.get("status") == "DELETING":
            continue
        arn = share["quotaShareArn"]
        if share.get("state") != "DISABLED":
            removals.append(PlannedChange("disable", name, {"quotaShareArn": arn, "state": "DISABLED"}))
        removals.append(PlannedChange("delete", name, {"quotaShareArn": arn}, ("not in the quota file",)))
    for spec in wanted:
        share = existing.get(spec.name)
        if share is None:
            creations.append(
                PlannedChange(
                    "create",
                    spec.name,
                    {
                        "quotaShareName": spec.name,
                        "jobQueue": job_queue,
                        "capacityLimits": spec.capacity_limits_api(),
                        "resourceSharingConfiguration": spec.resource_sharing_api(),
                        "preemptionConfiguration": spec.preemption_api(),
                        "state": "ENABLED",
                        "tags": {MANAGED_TAG: "true"},
                    },
                    (
                        f"capacity {_fmt_limits(spec)}",
                        format_sharing(spec),
                        f"inSharePreemption {spec.in_share_preemption}",
                    ),
                )
            )
            continue
        if share.get("status") == "DELETING":
            raise PolicyError(
                f"{path}.quotas",
                f"quota share {spec.name!r} is being deleted in job queue {job_queue}; apply again once it is gone",
            )
        request, changes = _diff(spec, QuotaShareSpec.from_api(share), share.get("state", "ENABLED"))
        if request:
            request["quotaShareArn"] = share["quotaShareArn"]
            updates.append(PlannedChange("update", spec.name, request, tuple(changes)))
        else:
            unchanged.append(spec.name)
    remaining = len(existing) - sum(1 for c in removals if c.action == "delete") + len(creations)
    if remaining > MAX_QUOTA_SHARES_PER_QUEUE:
        raise PolicyError(
            f"{path}.quotas",
            f"job queue {job_queue} would hold {remaining} quota shares; AWS Batch allows at most "
            f"{MAX_QUOTA_SHARES_PER_QUEUE}",
        )
    return QuotaSharePlan(
        job_queue=job_queue,
        changes=tuple(removals + updates + creations),
        unchanged=tuple(unchanged),
        notes=tuple(local_only_notes(queue)),
    )
