"""Bodies of the UI page's own endpoints (``/quota/ui``): one snapshot shaped for drawing, so the page
needs one request per refresh. Not a public API; the REST models are in :mod:`.datamodels`."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from airflow.api_fastapi.core_api.base import BaseModel


class PendingJobView(BaseModel):
    """A waiting job, as a row under its quota's bar."""

    id: str = Field(description="Job id.")
    label: str = Field(description="dag_id.task_id[map_index] and run id, for people.")
    gpus: int = Field(description="GPUs the job asks for (a gang's total).")
    nodes: int = Field(description="Hosts it needs at once: 1, or a gang's nodes (gpus / nodes on each).")
    gpu_types: list[str] = Field(default=[], description="GPU types it may run on, in its order (empty: any).")
    priority: int = Field(description="Its priority.")
    position: int | None = Field(description="Position in its quota's queue (1 = next).")
    reason: str = Field(description="Why it waits, in words.")
    expected_start: str = Field(description='Its estimated start in words ("expected to start in about 12 min").')
    waiting_s: float = Field(description="Seconds in its current wait (the REST API's waiting_since to now).")
    ti_url: str = Field(description="Link to the task instance in the Airflow UI.")


class TypeFiguresView(BaseModel):
    """A quota's figures on one GPU type of a typed job queue, a line under its bar."""

    name: str = Field(description="The GPU type.")
    capacity: int = Field(description="The quota's share of that type.")
    owned: int = Field(description="GPUs of that share its jobs use.")
    borrowed: int = Field(description="GPUs of that type used above that share.")
    lent: int = Field(description="GPUs of that share in use by other quotas.")
    idle: int = Field(description="GPUs of that share nobody uses.")
    free: int = Field(description="The most GPUs of that type a new job could start now without preemption.")


class QuotaBarView(BaseModel):
    """One quota's bar. Segments over its capacity: owned (own jobs), lent (others' jobs), idle; then
    borrowed beyond the capacity line."""

    name: str = Field(description="Quota name.")
    capacity: int = Field(description="Nominal share in GPUs: the capacity line of the bar.")
    owned: int = Field(description="GPUs of its own capacity its jobs use (in use minus borrowed).")
    borrowed: int = Field(description="GPUs used above its capacity.")
    lent: int = Field(description="GPUs of its capacity in use by other quotas.")
    idle: int = Field(description="GPUs of its capacity nobody uses.")
    free: int = Field(description="The most GPUs a new job of this quota could start now without preemption.")
    sharing: str = Field(description="reserve | lend | lend_and_borrow.")
    borrow_limit: int | None = Field(description="Most GPUs it may borrow; null: unlimited.")
    lend_limit: int | None = Field(description="Most GPUs it lends; null: all idle ones.")
    max_priority: int | None = Field(description="Highest allowed job priority; null: no limit.")
    pending_jobs: int = Field(description="Jobs waiting.")
    pending_gpus: int = Field(description="GPUs those jobs ask for.")
    pending: list[PendingJobView] = Field(description="Waiting jobs, by position.")
    cohort: str | None = Field(default=None, description="Cohort the quota is drawn in; null: the job queue itself.")
    types: list[TypeFiguresView] = Field(default=[], description="Per GPU type of a typed job queue, in its order "
                                         "(none: untyped).")


class CohortTypeView(BaseModel):
    """A cohort's subtree's figures on one GPU type of a typed job queue, a line under its heading."""

    name: str = Field(description="The GPU type.")
    capacity: int = Field(description="GPUs of that type its subtree owns.")
    in_use: int = Field(description="GPUs of that type its quotas' jobs hold.")
    borrowed: int = Field(description="GPUs of that type its subtree uses above its share of it.")
    lent: int = Field(description="GPUs of its subtree's share of that type used outside it.")


class CohortView(BaseModel):
    """A cohort of a job queue, drawn as a box around its quotas and cohorts."""

    name: str = Field(description="Cohort name.")
    parent: str | None = Field(description="Cohort it is drawn in; null: the job queue itself.")
    capacity: int = Field(description="GPUs its subtree owns: its own capacity and its members'.")
    in_use: int = Field(description="GPUs its quotas' jobs hold.")
    borrowed: int = Field(description="GPUs its subtree uses above its share, from the rest of the tree.")
    lent: int = Field(description="GPUs of its subtree's capacity used outside it.")
    types: list[CohortTypeView] = Field(default=[], description="Per GPU type of a typed job queue, in its order "
                                        "(none: untyped).")


class QueueView(BaseModel):
    """A job queue and its quotas' bars."""

    name: str = Field(description="Job queue name.")
    capacity: int = Field(description="GPUs of the job queue.")
    in_use: int = Field(description="GPUs in use in the queue.")
    quotas: list[QuotaBarView] = Field(description="One bar per quota, in file order.")
    cohorts: list[CohortView] = Field(default=[], description="Its cohorts, in file order (none: flat).")
    types: list[str] = Field(default=[], description='Its GPU types with their GPUs ("h100: 16"), in its order of '
                             "preference (none: untyped).")
    fungibility: str | None = Field(default=None, description="With GPU types: when_can_borrow and "
                                    "when_can_preempt, in words; null: untyped.")


class PreemptionView(BaseModel):
    """A recent preemption: who was stopped, for whom, and why."""

    at: datetime = Field(description="When the victim was told to stop.")
    victim: str = Field(description="The stopped job: dag_id.task_id and run id.")
    victim_quota: str | None = Field(description="The victim's quota.")
    preemptor: str = Field(description="The job it was stopped for (label, or its id when unknown).")
    preemptor_quota: str | None = Field(description="The preemptor's quota.")
    reason: str | None = Field(description="within_quota | reclaim | borrow_within.")
    message: str | None = Field(description="Extra details (e.g. the preemption limit was reached).")


class DashboardResponse(BaseModel):
    """Everything the quota page draws, at one moment."""

    generated_at: datetime = Field(description="When this snapshot was taken.")
    quota_file: str = Field(description="Path of the quota file in use.")
    queues: list[QueueView] = Field(description="Job queues with their quotas.")
    preemptions: list[PreemptionView] = Field(description="The most recent preemptions, newest first.")
    editable_quotas: list[str] = Field(
        default=[], description="Quotas whose jobs' priority the user may change (edit access to their pool)."
    )
