"""What the policy decides over: one job queue's quotas, its hosts, and its running and pending jobs.

:class:`State` is plain, immutable data. The executor builds it from its tables, the simulator from
its event loop, and the decision-file CLI from JSON through :func:`parse_state`. The one exception:
the simulator passes its waiting and running jobs as a
:class:`~airflow_quota_provider.policy.backlog.Backlog` and a
:class:`~airflow_quota_provider.policy.running.Running` that it updates between decisions
(``decide`` only reads them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow_quota_provider.policy.config import (
    DEFAULT_GANG_RESERVATION_AFTER_S, MAX_GRACE_PERIOD_S, MAX_QUOTAS_PER_QUEUE, Cohort, Queue, Quota,
    parse_gang_reservation, parse_queue_body,
)
from airflow_quota_provider.policy.errors import PolicyError
from airflow_quota_provider.policy.backlog import Backlog
from airflow_quota_provider.policy.fields import Fields
from airflow_quota_provider.policy.jobs import MAX_NODES, Host, Job
from airflow_quota_provider.policy.running import Running
from airflow_quota_provider.policy.types import Fungibility, GpuType


@dataclass(frozen=True)
class State:
    """One job queue at one moment.

    ``capacity`` is what the quota arithmetic (capacities, borrowing, lending) shares out, as given;
    ``hosts`` are the physical constraint on top of it: a job starts only on one host with enough
    free GPUs. Hosts may sum to less than ``capacity``: a lost host's GPUs are then missing from the
    fleet while the quotas keep their shares (a caller that wants the quotas to shrink too passes the
    live capacity). ``hosts=None`` is one implicit host of ``capacity`` GPUs, and the policy decides
    exactly as it did before hosts existed. A job larger than the largest host given is rejected, and
    a rejection is final: leaving out the only host large enough for a job rejects that job.
    """

    capacity: int
    quotas: tuple[Quota, ...]
    running: tuple[Job, ...] | Running
    """The running jobs: any sequence, or a :class:`Running` kept up to date by the caller."""
    pending: tuple[Job, ...] | Backlog
    """The waiting jobs: any sequence, or a :class:`Backlog` kept up to date by the caller."""
    hosts: tuple[Host, ...] | None = None
    cohorts: tuple[Cohort, ...] = ()
    """The queue's cohorts (DESIGN §2, hierarchical cohorts); empty: the quotas are flat."""
    types: tuple[GpuType, ...] = ()
    """A job queue with GPU types: each type's capacities (:mod:`.types`); then ``capacity``,
    ``quotas`` and ``cohorts`` are only their sums, and each type decides apart."""
    fungibility: Fungibility = Fungibility()
    gang_reservation_after_s: float | None = DEFAULT_GANG_RESERVATION_AFTER_S
    """The job queue's ``gang_reservation_after_s``: a gang waiting this long gets hosts kept for it
    (None: never)."""

    @classmethod
    def for_queue(
        cls,
        queue: Queue,
        running: Iterable[Job] | Running,
        pending: Iterable[Job] | Backlog,
        hosts: Iterable[Host] | None = None,
    ) -> State:
        running = running if isinstance(running, Running) else tuple(running)
        pending = pending if isinstance(pending, Backlog) else tuple(pending)
        return cls(
            capacity=queue.capacity,
            quotas=queue.quotas,
            running=running,
            pending=pending,
            hosts=None if hosts is None else tuple(hosts),
            cohorts=queue.cohorts,
            types=queue.types,
            fungibility=queue.fungibility,
            gang_reservation_after_s=queue.gang_reservation_after_s,
        )


def _parse_host(data: Any, path: str, types: tuple[str, ...]) -> tuple[Host, str | None]:
    """One ``hosts`` entry, and the job queue it names (``queue`` is optional); with GPU ``types``
    its ``type`` is one of them."""
    fields = Fields(data, path)
    host = Host(
        name=fields.str("name"), gpus=fields.int("gpus", minimum=1), down=fields.bool("down", False),
        rack=fields.str("rack", None), zone=fields.str("zone", None),
        type=fields.str("type", choices=types) if types else None,
    )
    queue = fields.str("queue", None)
    fields.done()
    return host, queue


def _parse_hosts(fields: Fields, capacity: int, types: tuple[GpuType, ...] = ()) -> tuple[Host, ...] | None:
    """The decision file's ``hosts``: absent or null for one implicit host of ``capacity`` GPUs.

    A host may say which job queue it serves (as the executor's host rows do); a decision file is
    one job queue that it does not name, so the only check is that all hosts name the same one.
    Hosts may sum to less than ``capacity`` (lost hosts), never to more.
    """
    if fields.raw("hosts", None) is None:
        return None
    items = fields.list("hosts")
    if not items:
        raise PolicyError(fields.child("hosts"), "at least one host, or leave hosts out for one implicit host of the capacity")
    hosts: list[Host] = []
    seen: dict[str, str] = {}
    first_queue: tuple[str, str] | None = None
    for item, path in items:
        host, queue = _parse_host(item, path, tuple(t.name for t in types))
        if host.name in seen:
            raise PolicyError(f"{path}.name", f"duplicate host name {host.name!r} (also at {seen[host.name]})")
        seen[host.name] = f"{path}.name"
        if queue is not None:
            if first_queue is None:
                first_queue = (queue, f"{path}.queue")
            elif queue != first_queue[0]:
                raise PolicyError(
                    f"{path}.queue",
                    f"{queue!r} is not one of {first_queue[0]} (a decision file is one job queue, as {first_queue[1]} says)",
                )
        hosts.append(host)
    total = sum(host.gpus for host in hosts)
    if total > capacity:
        raise PolicyError(fields.child("hosts"), f"host GPUs sum to {total}, above the job queue's capacity {capacity}")
    for gpu_type in types:
        total = sum(host.gpus for host in hosts if host.type == gpu_type.name)
        if total > gpu_type.capacity:
            raise PolicyError(
                fields.child("hosts"), f"{gpu_type.name} host GPUs sum to {total}, above the job queue's {gpu_type.name} capacity {gpu_type.capacity}"
            )
    return tuple(hosts)


def _parse_job(
    data: Any, path: str, quota_names: tuple[str, ...], *, running: bool, host_names: tuple[str, ...] | None = None,
    types: tuple[str, ...] = (),
) -> Job:
    """One ``running`` or ``pending`` entry; ``host`` is required on running jobs when there are hosts
    (a gang's ``hosts``, one per node, node 0's first). ``gpus`` is per host, as a task says it."""
    fields = Fields(data, path)
    job_id = fields.str("id")
    quota = fields.str("quota", choices=quota_names)
    gpus = fields.int("gpus", minimum=1)
    nodes = fields.int("nodes", 1, minimum=1)
    if nodes > MAX_NODES:
        raise PolicyError(fields.child("nodes"), f"{nodes} is above the maximum {MAX_NODES} hosts of one job")
    hosts: tuple[str, ...] = ()
    if running and host_names is not None and nodes > 1:
        hosts = _parse_gang_hosts(fields, nodes, host_names)
    job = Job(
        id=job_id,
        quota=quota,
        gpus=gpus * nodes,
        nodes=nodes,
        hosts=hosts,
        priority=fields.int("priority", minimum=None),
        submitted_at=fields.number("submitted_at", minimum=None),
        started_at=fields.number("started_at", minimum=None) if running else None,
        preemptible=fields.bool("preemptible", True),
        max_preemptions=fields.int("max_preemptions", None, nullable=True),
        preemptions=fields.int("preemptions", 0),
        min_runtime_s=fields.number("min_runtime_s", None, nullable=True),
        grace_period_s=fields.number("grace_period_s", None, maximum=MAX_GRACE_PERIOD_S, nullable=True),
        last_checkpoint_at=fields.number("last_checkpoint_at", None, minimum=None, nullable=True),
        expected_runtime_s=fields.number("expected_runtime_s", None, nullable=True),
        preempted_for=fields.str("preempted_for", None) if running else None,
        host=hosts[0] if hosts else fields.str("host", choices=host_names) if running and host_names is not None else None,
        gpu_types=() if running else _parse_gpu_types(fields, types),
        gpu_type=fields.str("gpu_type", choices=types) if running and types else None,
    )
    if not types and fields.has("gpu_type"):
        raise PolicyError(fields.child("gpu_type"), "only allowed when the job queue's capacity is per GPU type")
    for key in ("host", "hosts"):
        if running and host_names is None and fields.has(key):
            raise PolicyError(fields.child(key), "only allowed when the decision file lists hosts")
    if not running and fields.has("hosts"):
        raise PolicyError(fields.child("hosts"), "only allowed on running jobs")
    fields.done()
    return job


def _parse_gpu_types(fields: Fields, types: tuple[str, ...]) -> tuple[str, ...]:
    """A waiting job's ``gpu_type``: a type, or a list of them in its order of preference; any of the
    job queue's types (a job asking only for others is rejected by the decision, saying so)."""
    if not types:
        return ()
    value = fields.raw("gpu_type", None)
    items = [value] if isinstance(value, str) else value
    if value is None:
        return ()
    if not isinstance(items, list) or not items or not all(isinstance(t, str) and t for t in items) or len(items) > 16:
        raise PolicyError(fields.child("gpu_type"), f"expected a GPU type or a list of up to 16 of them, got {value!r}")
    return tuple(dict.fromkeys(items))


def _parse_gang_hosts(fields: Fields, nodes: int, host_names: tuple[str, ...]) -> tuple[str, ...]:
    """A running gang's ``hosts``: ``nodes`` different names of the file's hosts."""
    if fields.has("host"):
        raise PolicyError(fields.child("host"), f"a job of {nodes} nodes gives hosts (one per node), not host")
    items = fields.list("hosts")
    if len(items) != nodes:
        raise PolicyError(fields.child("hosts"), f"{len(items)} hosts for {nodes} nodes (one host per node)")
    known = set(host_names)
    hosts = []
    for item, path in items:
        if not isinstance(item, str) or item not in known:
            raise PolicyError(path, f"{item!r} is not one of the hosts: {', '.join(host_names)}")
        if item in hosts:
            raise PolicyError(path, f"host {item} twice: a gang's nodes are on different hosts")
        hosts.append(item)
    return tuple(hosts)


def _check_hosts_hold(running: tuple[Job, ...], hosts: tuple[Host, ...]) -> None:
    """No host holds more GPUs than it has."""
    gpus = {host.name: host.gpus for host in hosts}
    held = dict.fromkeys(gpus, 0)
    for index, job in enumerate(running):
        for host in job.placed_on:
            held[host] += job.gpus_per_node
            if held[host] > gpus[host]:
                raise PolicyError(
                    f"running[{index}].{'hosts' if job.hosts else 'host'}",
                    f"host {host} has {gpus[host]} GPUs; its running jobs hold {held[host]} with this one",
                )


def parse_state(data: Any, *, max_quotas_per_queue: int = MAX_QUOTAS_PER_QUEUE) -> tuple[State, float]:
    """Read a decision file (DESIGN §4) into ``(state, now)``; bad input raises :class:`PolicyError`.

    With ``hosts``, every running job names its host, and no host holds more GPUs than it has.
    """
    fields = Fields(data, "")
    now = fields.number("now", minimum=None)
    capacity, quotas, cohorts, types, fungibility = parse_queue_body(fields, "", max_quotas=max_quotas_per_queue)
    gang_reservation_after_s = parse_gang_reservation(fields)
    names = tuple(q.name for q in quotas)
    type_names = tuple(t.name for t in types)
    hosts = _parse_hosts(fields, capacity, types)
    host_names = None if hosts is None else tuple(host.name for host in hosts)
    running = tuple(
        _parse_job(item, path, names, running=True, host_names=host_names, types=type_names)
        for item, path in fields.list("running", [])
    )
    pending = tuple(_parse_job(item, path, names, running=False, types=type_names) for item, path in fields.list("pending", []))
    fields.done()
    if hosts is not None:
        _check_hosts_hold(running, hosts)
        host_type = {host.name: host.type for host in hosts}
        for index, job in enumerate(running):
            for host in job.placed_on:
                if host_type[host] != job.gpu_type:
                    raise PolicyError(f"running[{index}].gpu_type", f"{job.gpu_type} on host {host}, whose GPUs are {host_type[host]}")
    seen: dict[str, str] = {}
    for kind, jobs in (("running", running), ("pending", pending)):
        for index, job in enumerate(jobs):
            path = f"{kind}[{index}].id"
            if job.id in seen:
                raise PolicyError(path, f"duplicate job id {job.id!r} (also at {seen[job.id]})")
            seen[job.id] = path
    state = State(
        capacity=capacity, quotas=quotas, running=running, pending=pending, hosts=hosts, cohorts=cohorts,
        types=types, fungibility=fungibility, gang_reservation_after_s=gang_reservation_after_s,
    )
    return state, now
