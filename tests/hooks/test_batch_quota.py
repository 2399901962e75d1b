"""BatchQuotaShareHook against the local AWS Batch fake (real boto3 serializer, paginators, waiters)."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace

import boto3
import pytest
from botocore.config import Config

from tests.aws_fake.fixtures import JOB_QUEUE, aws_fake  # noqa: F401  (fixture)

from airflow_quota_provider.hooks.batch_quota import TASK_INSTANCE_TAG, BatchQuotaShareHook
from airflow_quota_provider.policy import PolicyError, parse_quota_file

UNIT = "ml.p4d.24xlarge"
WRITES = ("CreateQuotaShare", "UpdateQuotaShare", "DeleteQuotaShare")


def quota_file(*quotas: dict, capacity: int = 16, unit: str | None = UNIT, max_quotas: int = 20, cohorts=()):
    queue = {"name": JOB_QUEUE, "capacity": capacity, "quotas": list(quotas), **({"cohorts": list(cohorts)} if cohorts else {})}
    if unit:
        queue["capacity_unit"] = unit
    return parse_quota_file({"queues": [queue]}, max_quotas_per_queue=max_quotas).queues[0]


TEAMS = (
    {"name": "team-a", "capacity": 8, "borrow_limit": 4},
    {"name": "team-b", "capacity": 4, "sharing": "lend", "preemption": {"within_quota": "never"}},
    {"name": "team-c", "capacity": 4, "sharing": "reserve"},
)


def writes(fake) -> list[str]:
    return [op for op, _ in fake.calls if op in WRITES]


def shares(fake) -> dict[str, dict]:
    return {s.name: s.to_api(with_tags=True) for s in fake.shares.values()}


@pytest.fixture
def hook(aws_fake):  # noqa: F811
    return BatchQuotaShareHook(aws_conn_id="aws_default")


def test_plan_is_shown_first_and_changes_nothing(hook, aws_fake):  # noqa: F811
    plan = hook.plan_quota_shares(JOB_QUEUE, quota_file(*TEAMS))

    assert [(c.action, c.name) for c in plan.changes] == [
        ("create", "team-a"),
        ("create", "team-b"),
        ("create", "team-c"),
    ]
    text = plan.render()
    assert "create  team-a (capacity 8 ml.p4d.24xlarge; LEND_AND_BORROW borrowLimit 50%" in text
    assert "create  team-c (capacity 4 ml.p4d.24xlarge; RESERVE; inSharePreemption ENABLED)" in text
    assert writes(aws_fake) == []
    assert aws_fake.shares == {}


def test_apply_creates_shares_with_the_mapped_settings(hook, aws_fake):  # noqa: F811
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, quota_file(*TEAMS)))

    got = shares(aws_fake)
    assert got["team-a"]["capacityLimits"] == [{"maxCapacity": 8, "capacityUnit": UNIT}]
    assert got["team-a"]["resourceSharingConfiguration"] == {"strategy": "LEND_AND_BORROW", "borrowLimit": 50}
    assert got["team-a"]["preemptionConfiguration"] == {"inSharePreemption": "ENABLED"}
    assert got["team-b"]["resourceSharingConfiguration"] == {"strategy": "LEND"}
    assert got["team-b"]["preemptionConfiguration"] == {"inSharePreemption": "DISABLED"}
    assert got["team-c"]["resourceSharingConfiguration"] == {"strategy": "RESERVE"}
    assert all(s["state"] == "ENABLED" for s in got.values())
    assert got["team-a"]["tags"] == {"airflow-quota-provider:managed": "true"}


def test_second_apply_plans_and_changes_nothing(hook, aws_fake):  # noqa: F811
    queue = quota_file(*TEAMS)
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, queue))
    before = writes(aws_fake)

    plan = hook.plan_quota_shares(JOB_QUEUE, queue)
    made = hook.apply_plan(plan)

    assert plan.empty and made == []
    assert plan.unchanged == ("team-a", "team-b", "team-c")
    assert "nothing to change" in plan.render()
    assert writes(aws_fake) == before


def test_unlimited_borrow_is_minus_one_and_stays_unchanged(hook, aws_fake):  # noqa: F811
    queue = quota_file({"name": "team-a", "capacity": 8})
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, queue))

    assert shares(aws_fake)["team-a"]["resourceSharingConfiguration"]["borrowLimit"] == -1
    assert hook.plan_quota_shares(JOB_QUEUE, queue).empty


def test_changed_file_updates_disables_and_deletes_until_aws_matches(hook, aws_fake):  # noqa: F811
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, quota_file(*TEAMS)))
    changed = quota_file(
        {"name": "team-a", "capacity": 10, "borrow_limit": 5},
        {"name": "team-b", "capacity": 4, "sharing": "lend"},
        {"name": "team-d", "capacity": 2, "sharing": "reserve"},
    )

    plan = hook.plan_quota_shares(JOB_QUEUE, changed)

    assert [(c.action, c.name) for c in plan.changes] == [
        ("disable", "team-c"),
        ("delete", "team-c"),
        ("update", "team-a"),
        ("update", "team-b"),
        ("create", "team-d"),
    ]
    by_name = {(c.action, c.name): c for c in plan.changes}
    # borrow_limit 4 of 8 and 5 of 10 are both 50%: only the capacity changes.
    assert by_name["update", "team-a"].changes == ("capacity 8 ml.p4d.24xlarge -> 10 ml.p4d.24xlarge",)
    assert by_name["update", "team-b"].changes == ("inSharePreemption DISABLED -> ENABLED",)
    aws_fake.slow_settle = True  # the service takes a moment: the waiter polls again
    reads = len(aws_fake.calls_of("DescribeQuotaShare"))
    hook.apply_plan(plan, waiter_delay=0)

    assert sorted(shares(aws_fake)) == ["team-a", "team-b", "team-d"]
    assert {s["status"] for s in shares(aws_fake).values()} == {"VALID"}
    # each disabled, updated and created share was waited for until VALID (two reads each)
    assert len(aws_fake.calls_of("DescribeQuotaShare")) - reads == 2 * 4
    assert shares(aws_fake)["team-a"]["capacityLimits"] == [{"maxCapacity": 10, "capacityUnit": UNIT}]
    assert hook.plan_quota_shares(JOB_QUEUE, changed).empty
    # AWS requires DISABLED before delete: the update came first.
    ops = [(op, body.get("state")) for op, body in aws_fake.calls if op in WRITES]
    assert ops.index(("UpdateQuotaShare", "DISABLED")) < ops.index(("DeleteQuotaShare", None))


def test_a_share_is_deleted_only_once_its_disabling_has_settled(hook, aws_fake):  # noqa: F811
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, quota_file(*TEAMS)))
    aws_fake.slow_settle = True
    plan = hook.plan_quota_shares(JOB_QUEUE, quota_file(*TEAMS[:2]))

    with pytest.raises(hook.conn.exceptions.ClientException, match="team-c is UPDATING; it can be deleted once VALID"):
        hook.apply_plan(plan, wait=False)
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, quota_file(*TEAMS[:2])), waiter_delay=0)
    assert sorted(shares(aws_fake)) == ["team-a", "team-b"]


def test_a_disabled_share_in_the_file_is_enabled_again(hook, aws_fake):  # noqa: F811
    queue = quota_file(*TEAMS)
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, queue))
    share = next(s for s in aws_fake.shares.values() if s.name == "team-b")
    share.state = "DISABLED"

    plan = hook.plan_quota_shares(JOB_QUEUE, queue)

    assert [(c.action, c.name, c.changes) for c in plan.changes] == [
        ("update", "team-b", ("state DISABLED -> ENABLED",))
    ]
    hook.apply_plan(plan)
    assert share.state == "ENABLED"


def test_more_than_20_quotas_are_refused_before_any_call(hook, aws_fake):  # noqa: F811
    quotas = [{"name": f"team-{i}", "capacity": 1} for i in range(21)]
    queue = quota_file(*quotas, capacity=21, max_quotas=25)

    with pytest.raises(PolicyError, match=r"queue.quotas: 21 quotas; an AWS Batch job queue holds at most 20"):
        hook.plan_quota_shares(JOB_QUEUE, queue)
    assert aws_fake.calls == []


def test_twenty_quotas_fit_and_the_fake_refuses_a_21st_like_aws(hook, aws_fake):  # noqa: F811
    quotas = [{"name": f"team-{i}", "capacity": 1} for i in range(20)]
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, quota_file(*quotas, capacity=20)))
    assert len(aws_fake.shares) == 20  # the paginator read them all (ListQuotaShares pages of 100)

    with pytest.raises(hook.conn.exceptions.ClientException, match="20 quota shares, the maximum"):
        hook.conn.create_quota_share(
            quotaShareName="team-20",
            jobQueue=JOB_QUEUE,
            capacityLimits=[{"maxCapacity": 1, "capacityUnit": UNIT}],
            resourceSharingConfiguration={"strategy": "RESERVE"},
            preemptionConfiguration={"inSharePreemption": "ENABLED"},
        )


def test_list_quota_shares_follows_pages(hook, aws_fake):  # noqa: F811
    quotas = [{"name": f"team-{i}", "capacity": 1} for i in range(5)]
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, quota_file(*quotas, capacity=5)))
    paginator = hook.conn.get_paginator("list_quota_shares")

    pages = list(paginator.paginate(jobQueue=JOB_QUEUE, PaginationConfig={"PageSize": 2}))

    assert [len(p["quotaShares"]) for p in pages] == [2, 2, 1]
    assert [s["quotaShareName"] for s in hook.list_quota_shares(JOB_QUEUE)] == [f"team-{i}" for i in range(5)]


@pytest.mark.parametrize(
    ("quota", "path", "message"),
    [
        pytest.param(
            {"name": "team-a", "capacity": 8, "borrow_limit": 3},
            "queue.quotas[0].borrow_limit",
            "3 is 37.5% of the quota's capacity 8; AWS Batch's borrowLimit is a whole percentage: "
            "use 2 (25%) or 4 (50%), or null (unlimited)",
            id="borrow_limit that is not a whole percentage is refused with the nearest ones",
        ),
        pytest.param(
            {"name": "team-a", "capacity": 8, "lend_limit": 2},
            "queue.quotas[0].lend_limit",
            "AWS Batch quota shares have no lend limit",
            id="lend_limit has no AWS counterpart",
        ),
        pytest.param(
            {"name": "team-a", "capacity": 8, "preemption": {"within_quota": "lower_or_newer_equal_priority"}},
            "queue.quotas[0].preemption.within_quota",
            "'lower_or_newer_equal_priority' has no AWS Batch counterpart; use one of never, lower_priority",
            id="within_quota maps only never and lower_priority",
        ),
        pytest.param(
            {"name": "team-a", "capacity": 8, "preemption": {"reclaim": "never"}},
            "queue.quotas[0].preemption.reclaim",
            "AWS Batch always reclaims lent capacity",
            id="reclaim other than any is refused for a lending quota",
        ),
        pytest.param(
            {"name": "team-a", "capacity": 8, "preemption": {"borrow_within": {"max_priority": 10}}},
            "queue.quotas[0].preemption.borrow_within",
            "AWS Batch has no borrow-within preemption",
            id="borrow_within is refused",
        ),
    ],
)
def test_what_aws_cannot_express_is_refused_naming_the_field(quota, path, message, aws_fake):  # noqa: F811
    with pytest.raises(PolicyError) as error:
        BatchQuotaShareHook().plan_quota_shares(JOB_QUEUE, quota_file(quota))
    assert error.value.path == path
    assert message in error.value.message
    assert aws_fake.calls == []


def test_cohorts_are_refused_before_any_call_since_batch_shares_are_flat(hook, aws_fake):  # noqa: F811
    queue = quota_file({"name": "team-a", "capacity": 8, "cohort": "ml"}, cohorts=[{"name": "ml", "capacity": 4}])
    with pytest.raises(PolicyError, match=r"^queue.cohorts: AWS Batch quota shares are flat"):
        hook.plan_quota_shares(JOB_QUEUE, queue)
    assert aws_fake.calls == []


def test_local_only_fields_are_noted_in_the_plan(hook):
    queue = quota_file({"name": "team-a", "capacity": 8, "max_preemptions": 3, "grace_period_s": 600})
    notes = hook.plan_quota_shares(JOB_QUEUE, queue).notes
    assert "team-a: grace_period_s=600 applies to the local executor only" in notes
    assert any(n.startswith("team-a: max_preemptions=3 is set per job on AWS Batch") for n in notes)
    assert not any("gang_reservation_after_s" in n for n in notes)  # the default, as the quotas' defaults
    queue = replace(queue, gang_reservation_after_s=3600.0)  # AWS Batch places a job's instances itself
    assert f"{JOB_QUEUE}: gang_reservation_after_s=3600 applies to the local executor only" in (
        hook.plan_quota_shares(JOB_QUEUE, queue).notes)


def test_a_queue_that_cannot_hold_quota_shares_is_refused(hook, aws_fake):  # noqa: F811
    aws_fake.add_job_queue("ecs-queue", job_queue_type="ECS")
    aws_fake.add_job_queue("fifo-queue", quota_share_policy=False)

    with pytest.raises(ValueError, match="'ecs-queue': jobQueueType is ECS, quota shares need SAGEMAKER_TRAINING"):
        hook.plan_quota_shares("ecs-queue", quota_file(*TEAMS))
    with pytest.raises(ValueError, match="'fifo-queue': has no scheduling policy"):
        hook.plan_quota_shares("fifo-queue", quota_file(*TEAMS))
    with pytest.raises(ValueError, match="'nope': not found"):
        hook.plan_quota_shares("nope", quota_file(*TEAMS))


# ---------------------------------------------------------------------------------- service jobs
REQUEST = {
    "TrainingJobName": "llama-ft",
    "ResourceConfig": {"InstanceType": UNIT, "InstanceCount": 2, "VolumeSizeInGB": 100},
}


@pytest.fixture
def applied(hook, aws_fake):  # noqa: F811
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, quota_file(*TEAMS)))
    return hook


def submit(hook, **kwargs):
    args = dict(job_name="llama-ft", job_queue=JOB_QUEUE, training_job_request=REQUEST, quota_share_name="team-a")
    args.update(kwargs)
    return hook.submit_service_job(**args)["jobId"]


def test_submit_sends_the_service_job_request(applied, aws_fake):  # noqa: F811
    job_id = submit(
        applied,
        scheduling_priority=70,
        preemption_retries_before_termination=2,
        retry_strategy={"attempts": 3},
        timeout_config={"attemptDurationSeconds": 3600},
        tags={TASK_INSTANCE_TAG: "tok"},
        client_token="tok",
    )

    body = aws_fake.calls_of("SubmitServiceJob")[0]
    assert body["serviceJobType"] == "SAGEMAKER_TRAINING"
    assert json.loads(body["serviceRequestPayload"]) == REQUEST
    assert body["quotaShareName"] == "team-a"
    assert body["schedulingPriority"] == 70
    assert body["preemptionConfiguration"] == {"preemptionRetriesBeforeTermination": 2}
    assert body["retryStrategy"] == {"attempts": 3}
    assert body["timeoutConfig"] == {"attemptDurationSeconds": 3600}
    assert body["clientToken"] == "tok"
    described = applied.describe_service_job(job_id)
    assert described["status"] == "SUBMITTED"
    assert described["schedulingPriority"] == 70


def test_priority_update_and_its_bounds(applied, aws_fake):  # noqa: F811
    job_id = submit(applied, scheduling_priority=10)

    applied.update_service_job_priority(job_id, 9000)

    assert applied.describe_service_job(job_id)["schedulingPriority"] == 9000
    with pytest.raises(ValueError, match=r"priority: 10000 is not an integer between 0 and 9999"):
        applied.update_service_job_priority(job_id, 10000)
    assert aws_fake.calls_of("UpdateServiceJob") == [{"jobId": job_id, "schedulingPriority": 9000}]


def test_terminate_fails_the_job_with_the_reason(applied, aws_fake):  # noqa: F811
    job_id = submit(applied)
    aws_fake.start(job_id)

    applied.terminate_service_job(job_id, "stopped by a person")

    described = applied.describe_service_job(job_id)
    assert (described["status"], described["statusReason"], described["isTerminated"]) == (
        "FAILED",
        "stopped by a person",
        True,
    )


def test_list_service_jobs_by_share_and_status_and_snapshot_usage(applied, aws_fake):  # noqa: F811
    a1, a2 = submit(applied), submit(applied, job_name="llama-ft-2")
    b1 = submit(applied, quota_share_name="team-b", training_job_request={**REQUEST, "ResourceConfig": {
        "InstanceType": UNIT, "InstanceCount": 1}})
    aws_fake.start(a1)
    aws_fake.make_runnable(a2)
    aws_fake.start(b1)

    assert [j["jobId"] for j in applied.list_service_jobs(JOB_QUEUE, quota_share_name="team-a",
                                                          job_status="RUNNABLE")] == [a2]
    assert {j["jobId"] for j in applied.list_service_jobs(JOB_QUEUE)} == {a1, b1}  # RUNNING by default
    rows = {row["quota_share"]: row for row in applied.quota_share_usage(JOB_QUEUE)}
    assert (rows["team-a"]["in_use"], rows["team-a"]["capacity"], rows["team-a"]["runnable_jobs"]) == (2.0, 8, 1)
    assert rows["team-a"]["front_job"].endswith(a2)
    assert (rows["team-b"]["in_use"], rows["team-b"]["running_jobs"]) == (1.0, 1)
    assert (rows["team-c"]["in_use"], rows["team-c"]["borrowed"]) == (0.0, 0.0)


def test_find_service_job_returns_the_newest_job_of_the_task_instance(applied, aws_fake):  # noqa: F811
    submit(applied, job_name="train-x", tags={TASK_INSTANCE_TAG: "ti-1"})
    submit(applied, job_name="train-x", tags={TASK_INSTANCE_TAG: "other"})
    newest = submit(applied, job_name="train-x", tags={TASK_INSTANCE_TAG: "ti-1"})
    submit(applied, job_name="train-y", tags={TASK_INSTANCE_TAG: "ti-1"})

    assert applied.find_service_job(JOB_QUEUE, "train-x", "ti-1")["jobId"] == newest
    assert applied.find_service_job(JOB_QUEUE, "train-x", "ti-2") is None


def test_quota_share_waiter_is_our_own_json(hook, aws_fake):  # noqa: F811
    assert {"service_job_complete", "quota_share_settled"} <= set(hook.list_waiters())
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, quota_file(*TEAMS)))
    arn = next(iter(aws_fake.shares))
    reads = len(aws_fake.calls_of("DescribeQuotaShare"))
    hook.wait_quota_share_settled(arn, delay=0, max_attempts=1)
    assert aws_fake.calls_of("DescribeQuotaShare")[reads:] == [{"quotaShareArn": arn}]


def test_the_connection_endpoint_reaches_the_fake(hook, aws_fake):  # noqa: F811
    # Not a patched client: boto3 sends HTTP to the endpoint_url of the Airflow connection.
    assert hook.conn.meta.endpoint_url == aws_fake.endpoint_url
    plain = boto3.client(
        "batch", endpoint_url=aws_fake.endpoint_url, region_name="us-east-1",
        aws_access_key_id="a", aws_secret_access_key="b",
    )
    assert plain.describe_job_queues()["jobQueues"][0]["jobQueueName"] == JOB_QUEUE
    assert copy.deepcopy(aws_fake.calls_of("DescribeJobQueues")) == [{}]


def test_the_fakes_test_hooks_are_reachable_over_http(applied, aws_fake):  # noqa: F811
    # For a process without a handle on the fake (e.g. an Airflow worker): POST /_fake/<hook>.
    import urllib.request

    job_id = submit(applied)

    def post(hook_name, **kwargs):
        request = urllib.request.Request(
            f"{aws_fake.endpoint_url}/_fake/{hook_name}", data=json.dumps(kwargs).encode(), method="POST"
        )
        with urllib.request.urlopen(request) as response:
            return response.status

    assert post("start", job_id=job_id) == 200
    assert post("preempt", job_id=job_id, reason="make room") == 200
    described = applied.describe_service_job(job_id)
    assert (described["status"], described["statusReason"]) == ("RUNNABLE", "make room")
    assert described["preemptionSummary"]["preemptedAttemptCount"] == 1


# ------------------------------------------------------------------ throttling


@pytest.mark.parametrize("code", ["ThrottlingException", "TooManyRequestsException"])
def test_a_throttled_call_is_retried_with_backoff_until_aws_answers(applied, aws_fake, code):  # noqa: F811
    job_id = submit(applied)
    aws_fake.throttle("DescribeServiceJob", 3, code)  # one more than botocore's default attempts

    assert applied.describe_service_job(job_id)["jobId"] == job_id
    assert len(aws_fake.calls_of("DescribeServiceJob")) == 4


def test_the_fake_throttles_with_the_codes_and_statuses_of_aws(applied, aws_fake):  # noqa: F811
    from botocore.exceptions import ClientError

    plain = boto3.client(
        "batch", endpoint_url=aws_fake.endpoint_url, region_name="us-east-1",
        aws_access_key_id="a", aws_secret_access_key="b", config=Config(retries={"total_max_attempts": 1}),
    )
    for code, status in (("ThrottlingException", 400), ("TooManyRequestsException", 429)):
        aws_fake.throttle("DescribeJobQueues", 1, code)
        with pytest.raises(ClientError) as error:
            plain.describe_job_queues()
        assert error.value.response["Error"]["Code"] == code
        assert error.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert plain.describe_job_queues()["jobQueues"]


def test_the_hook_retries_in_standard_mode_unless_the_connection_says_otherwise(aws_fake, monkeypatch):  # noqa: F811
    from botocore.exceptions import ClientError

    assert BatchQuotaShareHook().conn.meta.config.retries == {"mode": "standard", "total_max_attempts": 11}

    conn = json.loads(os.environ["AIRFLOW_CONN_AWS_DEFAULT"])
    conn["extra"]["config_kwargs"] = {"retries": {"mode": "standard", "total_max_attempts": 2}}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_STRICT", json.dumps(conn))
    hook = BatchQuotaShareHook(aws_conn_id="aws_strict")
    aws_fake.throttle("DescribeJobQueues", 3)
    with pytest.raises(ClientError, match="ThrottlingException"):
        hook.describe_job_queue(JOB_QUEUE)
    assert len(aws_fake.calls_of("DescribeJobQueues")) == 2
