"""Request and response bodies of the REST API (``/quota/api``); the UI page has its own in
:mod:`.datamodels_ui`. Every field is described: the descriptions are the API reference in ``/quota/docs``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field

from airflow.api_fastapi.core_api.base import BaseModel, StrictBaseModel
from airflow_quota_provider.models.base import PRIORITY_MAX, PRIORITY_MIN



class QueueTypeResponse(BaseModel):
    """One GPU type of a job queue with types."""

    name: str = Field(description="The GPU type, as the quota file names it.")
    capacity: int = Field(description="GPUs of that type in the job queue.")
    in_use: int = Field(description="GPUs of that type held by running and stopping jobs of the queue.")
    instance_type: str | None = Field(description="Instance type AWS Batch counts it in (instance_types), if set.")


class FungibilityResponse(BaseModel):
    """How a job of a typed job queue chooses among the types it may use (Kueue's flavorFungibility)."""

    when_can_borrow: str = Field(description="borrow | try_next_type: where it fits only by borrowing.")
    when_can_preempt: str = Field(description="try_next_type | preempt: where it fits only by preempting.")


class QueueResponse(BaseModel):
    """A job queue: a pool of GPUs shared by its quotas."""

    name: str = Field(description="Name of the job queue in the quota file.")
    capacity: int = Field(description="GPUs of the job queue.")
    capacity_unit: str | None = Field(description="Unit of the capacity on AWS Batch (an instance type), if set.")
    quotas: list[str] = Field(description="Names of the quotas that share the job queue, in file order.")
    common_pool: int = Field(
        description="GPUs not assigned to any quota or cohort; every borrowing quota may use them."
    )
    in_use: int = Field(description="GPUs held by running and stopping jobs of the queue.")
    pending_jobs: int = Field(description="Jobs waiting for quota in the queue.")
    types: list[QueueTypeResponse] | None = Field(
        default=None, description="Its GPU types in the queue's order of preference (capacity is their sum); "
        "null: one untyped kind of GPU."
    )
    fungibility: FungibilityResponse | None = Field(default=None, description="With GPU types: how jobs choose "
                                                    "among them; null: untyped.")


class QueueCollectionResponse(BaseModel):
    """Every job queue of the quota file."""

    queues: list[QueueResponse] = Field(description="The job queues, in file order.")
    total_entries: int = Field(description="Number of job queues.")


class PreemptionPolicyResponse(BaseModel):
    """When jobs of a quota may preempt others."""

    within_quota: str = Field(description="never | lower_priority | lower_or_newer_equal_priority.")
    reclaim: str = Field(description="never | lower_priority | any: taking back lent capacity from borrowers.")
    borrow_within: int | None = Field(
        description="Highest priority of other borrowing quotas' jobs that may be preempted while this quota "
        "itself borrows; null: off."
    )


class QuotaTypeResponse(BaseModel):
    """A quota's figures on one GPU type of a typed job queue (the type decided as a queue of its own)."""

    name: str = Field(description="The GPU type.")
    capacity: int = Field(description="The quota's share of that type, in GPUs.")
    in_use: int = Field(description="GPUs of that type held by the quota's running and stopping jobs.")
    borrowed: int = Field(description="GPUs of that type the quota uses above its share of it.")
    lent: int = Field(description="GPUs of its share of that type used by other quotas' jobs.")
    free: int = Field(description="The most GPUs of that type a new job of this quota could start now without "
                      "preemption.")
    idle: int = Field(description="GPUs of its share of that type that nobody uses.")


class QuotaResponse(BaseModel):
    """A shared quota: its rule and its figures right now (computed as the scheduler computes them)."""

    name: str = Field(description="Name of the quota; also its Airflow pool.")
    queue: str = Field(description="Job queue the quota belongs to.")
    capacity: int = Field(description="Nominal share of the quota, in GPUs.")
    in_use: int = Field(description="GPUs held by the quota's running and stopping jobs.")
    borrowed: int = Field(description="GPUs the quota uses above its capacity (lent by others or the common pool).")
    lent: int = Field(description="GPUs of the quota's capacity used by other quotas' jobs.")
    free: int = Field(description="The most GPUs a new job of this quota could start now without preemption.")
    pending_jobs: int = Field(description="Jobs of the quota waiting for capacity.")
    pending_gpus: int = Field(description="GPUs those waiting jobs ask for.")
    sharing: str = Field(description="reserve | lend | lend_and_borrow.")
    borrow_limit: int | None = Field(description="Most GPUs the quota may use above its capacity; null: unlimited.")
    lend_limit: int | None = Field(description="Most GPUs of its capacity the quota lends; null: all idle ones.")
    weight: float = Field(description="Fair-sharing weight among borrowers (higher borrows more).")
    max_priority: int | None = Field(description="Highest priority a job of the quota may have; null: no limit.")
    max_preemptions: int | None = Field(
        description="Preemptions a job survives before it fails (or is protected); null: requeued forever."
    )
    on_preemption_limit: str = Field(description="fail | protect: what happens past max_preemptions.")
    grace_period_s: float = Field(description="Seconds a preempted job gets to checkpoint before it is stopped.")
    preemption: PreemptionPolicyResponse = Field(description="The quota's preemption rules.")
    cohort: str | None = Field(default=None, description="Cohort the quota belongs to; null: the job queue's root.")
    types: list[QuotaTypeResponse] | None = Field(
        default=None, description="A quota of a job queue with GPU types: its figures per type, in the queue's "
        "order (capacity, in_use, borrowed, lent and free above are over all types, borrow_limit and lend_limit "
        "their sums); null: untyped. Waiting jobs have no type until admitted: pending figures are the quota's only."
    )


class QuotaCollectionResponse(BaseModel):
    """Every quota of every job queue."""

    quotas: list[QuotaResponse] = Field(description="The quotas, by job queue, in file order.")
    total_entries: int = Field(description="Number of quotas.")


class CohortTypeResponse(BaseModel):
    """A cohort's subtree's figures on one GPU type of a typed job queue."""

    name: str = Field(description="The GPU type.")
    subtree_capacity: int = Field(description="GPUs of that type its subtree owns.")
    in_use: int = Field(description="GPUs of that type held by the jobs of the quotas in its subtree.")
    borrowed: int = Field(description="GPUs of that type its subtree uses above its share of it.")
    lent: int = Field(description="GPUs of its subtree's share of that type used outside it.")


class CohortResponse(BaseModel):
    """A cohort: a group of quotas and cohorts of one job queue, with its subtree's figures right now."""

    name: str = Field(description="Name of the cohort in the quota file.")
    queue: str = Field(description="Job queue the cohort belongs to.")
    parent: str | None = Field(description="Cohort above it; null: the job queue's root.")
    capacity: int = Field(description="GPUs the cohort itself owns for its subtree.")
    subtree_capacity: int = Field(description="GPUs its subtree owns: its own capacity and its members'.")
    in_use: int = Field(description="GPUs held by the running and stopping jobs of the quotas in its subtree.")
    borrowed: int = Field(description="GPUs its subtree uses above its share, from the rest of the tree.")
    lent: int = Field(description="GPUs of its subtree's capacity used outside it.")
    borrow_limit: int | None = Field(description="Most GPUs the subtree may borrow; null: unlimited.")
    lend_limit: int | None = Field(description="Most GPUs the subtree lends outside it; null: all idle ones.")
    types: list[CohortTypeResponse] | None = Field(
        default=None, description="A cohort of a job queue with GPU types: its figures per type, in the queue's "
        "order (the figures above are over all types); null: untyped."
    )


class CohortCollectionResponse(BaseModel):
    """Every cohort of every job queue (none for a quota file without cohorts)."""

    cohorts: list[CohortResponse] = Field(description="The cohorts, by job queue, in file order.")
    total_entries: int = Field(description="Number of cohorts.")


class NodePlacement(BaseModel):
    """One node of a job and the GPUs it holds on its host."""

    host: str = Field(description="GPU host of the node.")
    devices: list[str] = Field(description="GPU indexes the node holds on that host.")


class JobResponse(BaseModel):
    """One try of one task instance placed on a quota."""

    id: str = Field(description="Job id (the path parameter of PATCH /jobs/{id}).")
    dag_id: str = Field(description="DAG of the task instance.")
    run_id: str = Field(description="DAG run of the task instance.")
    task_id: str = Field(description="Task of the task instance.")
    map_index: int = Field(description="Map index of the task instance; -1 when not mapped.")
    try_number: int = Field(description="Airflow try number (a preemption does not change it).")
    state: str = Field(description="pending | running | stopping | preempted | finished | failed.")
    quota: str = Field(description="Quota the job runs on.")
    queue: str | None = Field(description="Job queue of the quota, when the quota file names it.")
    gpus: int = Field(description="GPUs the job asks for.")
    gpu_types: list[str] = Field(default=[], description="GPU types it may run on, in its order of preference "
                                 "(gpu_type of the task); empty: any type of its job queue.")
    gpu_type: str | None = Field(default=None, description="GPU type it runs on (chosen when admitted); null unless "
                                 "running or stopping on a job queue with GPU types.")
    owned_gpus: int | None = Field(
        description="Of its GPUs, those within its quota's capacity; null unless running or stopping (or the "
        "quota file is unavailable)."
    )
    borrowed_gpus: int | None = Field(
        description="Of its GPUs, those above its quota's capacity: a quota's jobs fill its capacity in the reverse "
        "of the victim order, so these are the GPUs of the jobs a reclaim stops first, and they add up to the "
        "quota's borrowed (on a job queue with GPU types: above its quota's capacity of the job's type, adding up "
        "to that type's borrowed). Null unless running or stopping."
    )
    reclaim_candidate: bool | None = Field(
        description="Whether a lender taking its GPUs back may preempt it now: it holds borrowed GPUs, may be "
        "preempted at all (preemptible, past min_runtime_s, not protected at its limit), and a quota of its "
        "job queue lends GPUs now under a reclaim rule that reaches its priority. Null unless running or stopping."
    )
    nodes: int = Field(description="Hosts the job runs on at once: 1, or a gang's nodes (gpus is then the total, "
                       "gpus / nodes on each).")
    host: str | None = Field(description="GPU host the job runs on, or ran on last (null before its first start); "
                             "a gang's node 0.")
    hosts: list[str] = Field(description="The hosts the job holds devices on, node 0's first: one per node of a "
                             "gang while it holds devices (empty while it waits), [host] for a job of one node.")
    devices: list[str] = Field(description="GPU indexes the job holds now on its host, a gang's node 0 (empty unless "
                               "running or stopping); placement has every node's.")
    placement: list[NodePlacement] = Field(description="Per node, node 0 first: its host and the GPU indexes it "
                                           "holds there (empty unless running or stopping).")
    priority: int = Field(description="Scheduling priority; higher runs first and may preempt lower.")
    max_priority: int | None = Field(
        description="Highest priority its quota allows (PATCH refuses more); null: no limit, or the quota file "
        "is unavailable."
    )
    preemptible: bool = Field(description="Whether the job may be preempted at all.")
    preemptions: int = Field(description="Times the task instance has been preempted so far.")
    max_preemptions: int | None = Field(description="The job's own preemption limit; null: the quota's.")
    preemption_limit: int | None = Field(
        description="The preemption limit that applies: its own max_preemptions, else its quota's; null: none "
        "(or the quota file is unavailable)."
    )
    last_checkpoint_at: datetime | None = Field(
        description="When it last saved a checkpoint in this run, where the api-server sees its checkpoint "
        "directory (a local or mounted [quota] checkpoint_root); null when unknown or not running."
    )
    pending_reason: str | None = Field(description="Why the job waits, in words; null unless pending.")
    pending_position: int | None = Field(description="Position in its quota's queue (1 = next); null unless pending.")
    estimated_start_at: datetime | None = Field(
        description="When it is expected to start, forecast every few scheduling cycles with expected runtimes "
        "and no new submissions; null unless pending, or when unknown (a job it waits for has no expected "
        "runtime, or not forecast yet)."
    )
    expected_start: str | None = Field(
        description='The estimate in words ("expected to start in about 12 min", or why unknown); null unless pending.'
    )
    waiting_since: datetime | None = Field(
        description="When its current wait began: its submission, or the last time it went back in line "
        "(preempted, evicted, revoked), whichever is later; null unless pending."
    )
    preempted_for: str | None = Field(description="Job id this job was told to stop for; null unless stopping.")
    submitted_at: datetime = Field(description="When the executor received the task (kept across preemptions).")
    started_at: datetime | None = Field(description="When the job was last admitted; null while it waits.")
    finished_at: datetime | None = Field(description="When the job finished or failed.")
    message: str | None = Field(description="Last outcome message (exit code, rejection, preemption limit).")
    ti_url: str = Field(description="Link to the task instance in the Airflow UI.")


class JobCollectionResponse(BaseModel):
    """A page of jobs, oldest submission first."""

    jobs: list[JobResponse] = Field(description="The jobs on this page.")
    total_entries: int = Field(description="Jobs matching the filters, on all pages.")


def _json_integer(value: Any) -> Any:
    """A JSON number without a fraction (``50.0``) is an integer, as JSON Schema's ``integer`` says
    (JSON has one number type); everything else reaches the strict check as it came."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class JobPatchBody(StrictBaseModel):
    """A change to a job; only the priority can change.

    Strict: a JSON integer (50, or 50.0) from -2147483648 to 2147483647, and nothing else: "50",
    true, 50.5, NaN, 1e400 and null are refused (422) naming priority.
    """

    model_config = ConfigDict(strict=True)

    priority: Annotated[int, BeforeValidator(_json_integer)] = Field(
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="New priority (a JSON integer from -2147483648 to 2147483647, higher runs first); at most "
        "the quota's max_priority.",
    )


class EventResponse(BaseModel):
    """One line of the audit log."""

    id: int = Field(description="Event id, increasing.")
    at: datetime = Field(description="When it happened.")
    kind: str = Field(description="submitted, admitted, borrowed, preempted, reclaimed, stopped, released, "
                      "finished, priority_changed, preemption_limit_reached, rejected, revoked, adopted, evicted, "
                      "host_joined, host_lost, config_loaded or config_rejected.")
    job_id: str | None = Field(description="Job the event is about, if any.")
    dag_id: str | None = Field(description="DAG of that job's task instance.")
    run_id: str | None = Field(description="DAG run of that job's task instance.")
    task_id: str | None = Field(description="Task of that job's task instance.")
    map_index: int | None = Field(description="Map index of that job's task instance.")
    quota: str | None = Field(description="Quota of that job.")
    victim: str | None = Field(description="Preempted job id (preemption events).")
    preemptor: str | None = Field(description="Job id the victim was preempted for (preemption events).")
    reason: str | None = Field(description="within_quota | reclaim | borrow_within (preemption events).")
    host: str | None = Field(description="GPU host of the devices, or the host joining or lost (host events).")
    devices: list[str] = Field(description="GPU indexes admitted or released (empty when none).")
    message: str | None = Field(description="Details in words.")


class EventCollectionResponse(BaseModel):
    """A page of the audit log, newest first."""

    events: list[EventResponse] = Field(description="The events on this page, newest first.")
    total_entries: int = Field(description="Events matching the filters, on all pages.")


class UsageRow(BaseModel):
    """GPU-seconds charged to one quota, DAG or DAG owner over the period (``airflow quota usage``'s rows)."""

    key: str = Field(description="The quota, DAG id or owner (as `by` says); `unknown` for a DAG without an owner.")
    capacity_s: float | None = Field(description="Quota rows: capacity x period, GPU-seconds (used_within + lent + idle).")
    used_within: float = Field(description="GPU-seconds used within the quota's capacity.")
    borrowed: float = Field(description="GPU-seconds held above the quota's capacity.")
    lent: float | None = Field(description="Quota rows: GPU-seconds of its idle capacity held by borrowers.")
    idle: float | None = Field(description="Quota rows: GPU-seconds of its capacity nobody used.")
    lost: float = Field(description="GPU-seconds of work lost to preemption (since the last checkpoint, or the start).")
    gpu_type: str | None = Field(
        default=None, description="Where a job queue has GPU types: the type of this row's figures (one row per key and type); "
        "null for an untyped queue's quotas.")
    cost: float | None = Field(
        default=None, description="Where the quota file has a `gpu_hour_price`: the used_within + borrowed GPU-hours at the "
        "price of each quota and GPU type; null where one of them has no price.")


class UsageBucket(BaseModel):
    """One bucket of a usage series: each quota's GPU-seconds in [since, until)."""

    since: datetime = Field(description="Start of the bucket (inclusive).")
    until: datetime = Field(description="End of the bucket (exclusive); the last one ends at the period's end.")
    rows: list[UsageRow] = Field(description="One row per quota, sorted by key.")


class UsageResponse(BaseModel):
    """Chargeback over a period: the same figures as `airflow quota usage`."""

    since: datetime = Field(description="Start of the period (inclusive).")
    until: datetime = Field(description="End of the period (exclusive).")
    by: str = Field(description="quota | dag | owner.")
    rows: list[UsageRow] = Field(description="One row per quota, DAG or owner, sorted by key.")
    series: list[UsageBucket] | None = Field(
        default=None, description="With `every`: per bucket, in time order, the quotas' rows (they add up to `rows` for by=quota).")
