"""The REST API under /quota/api against a running Airflow api-server (tests/quota_api_support.py)."""

from __future__ import annotations

import getpass
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from importlib.metadata import entry_points

import pytest

from airflow_quota_provider.get_provider_info import get_provider_info
from tests.quota_api_support import REASON_BEHIND, REASON_BLOCKED

READ_ROUTES = [
    "/quota/api/queues",
    "/quota/api/quotas",
    "/quota/api/jobs",
    "/quota/api/events",
    "/quota/api/usage?since=0",
    "/quota/api/openapi.json",
    "/quota/ui/",
    "/quota/ui/dashboard",
    "/quota/ui/static/quota.js",
    "/quota/ui/static/quota.css",
]


@pytest.fixture(scope="module")
def jobs(server):
    return server.baseline()


def test_plugin_is_registered_once_and_loaded_by_the_api_server(server):
    (entry,) = [ep for ep in entry_points(group="airflow.plugins") if ep.name == "quota"]
    assert entry.value == "airflow_quota_provider.plugins.quota_plugin:QuotaPlugin"
    assert "plugins" not in get_provider_info()

    status, body = server.request("GET", "/api/v2/plugins", user="admin")
    assert status == 200
    (plugin,) = [p for p in body["plugins"] if p["name"] == "quota"]
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/quota"
    (view,) = plugin["external_views"]
    assert (view["href"], view["url_route"], view["destination"]) == ("/quota/ui/", "gpu-quotas", "nav")


@pytest.mark.parametrize("path", READ_ROUTES)
def test_every_route_refuses_a_request_without_a_token(server, path):
    status, body = server.request("GET", path)
    assert status == 401, body


def test_patch_refuses_a_request_without_a_token(server, jobs):
    status, _ = server.request("PATCH", f"/quota/api/jobs/{jobs['team_a_pending_behind']}", {"priority": 30})
    assert status == 401


@pytest.mark.parametrize("path", READ_ROUTES)
def test_a_viewer_may_read_every_route(server, jobs, path):
    status, _ = server.request("GET", path, user="viewer")
    assert status == 200


def test_quotas_show_the_figures_the_policy_computes(server, jobs):
    status, body = server.request("GET", "/quota/api/quotas", user="viewer")
    assert status == 200
    by_name = {q["name"]: q for q in body["quotas"]}
    assert body["total_entries"] == 3
    figures = ("queue", "capacity", "in_use", "borrowed", "lent", "free", "pending_jobs", "pending_gpus")
    assert {k: by_name["team-a"][k] for k in figures} == {
        "queue": "gpu-fleet", "capacity": 4, "in_use": 2, "borrowed": 0, "lent": 1, "free": 1,
        "pending_jobs": 2, "pending_gpus": 3,
    }
    assert {k: by_name["team-b"][k] for k in figures} == {
        "queue": "gpu-fleet", "capacity": 4, "in_use": 5, "borrowed": 1, "lent": 0, "free": 1,
        "pending_jobs": 0, "pending_gpus": 0,
    }
    assert (by_name["team-a"]["sharing"], by_name["team-a"]["max_priority"]) == ("lend_and_borrow", 100)
    assert (by_name["team-b"]["borrow_limit"], by_name["team-lab"]["sharing"]) == (4, "reserve")
    assert by_name["team-a"]["preemption"] == {"within_quota": "lower_priority", "reclaim": "any", "borrow_within": None}
    assert by_name["team-a"]["types"] is None  # an untyped job queue's quota has no figures per GPU type


def test_queues_list_their_quotas_and_usage(server, jobs):
    status, body = server.request("GET", "/quota/api/queues", user="viewer")
    assert status == 200
    fleet = next(q for q in body["queues"] if q["name"] == "gpu-fleet")
    assert fleet == {
        "name": "gpu-fleet", "capacity": 8, "capacity_unit": None, "quotas": ["team-a", "team-b"],
        "common_pool": 0, "in_use": 7, "pending_jobs": 2, "types": None, "fungibility": None,
    }


def test_jobs_filtered_by_quota_and_state_carry_reason_position_devices_and_link(server, jobs):
    status, body = server.request("GET", "/quota/api/jobs?quota=team-a&state=pending", user="viewer")
    assert status == 200
    rows = {j["task_id"]: j for j in body["jobs"]}
    assert set(rows) >= {"team_a_pending_blocked", "team_a_pending_behind"}
    blocked = rows["team_a_pending_blocked"]
    assert (blocked["state"], blocked["pending_position"], blocked["pending_reason"]) == ("pending", 1, REASON_BLOCKED)
    assert rows["team_a_pending_behind"]["pending_reason"] == REASON_BEHIND
    assert blocked["ti_url"] == "http://127.0.0.1:18210/dags/quota_cases/runs/seeded/tasks/team_a_pending_blocked"
    assert blocked["started_at"] is None and blocked["submitted_at"]
    assert blocked["expected_start"] == "expected to start in about 12 min" and blocked["estimated_start_at"]
    behind = rows["team_a_pending_behind"]  # not forecast yet
    assert behind["estimated_start_at"] is None and behind["expected_start"].startswith("start time unknown")

    status, body = server.request("GET", "/quota/api/jobs?state=running,finished&quota=team-b", user="viewer")
    rows = {j["task_id"]: j for j in body["jobs"]}
    assert rows["team_b_borrower_running"]["devices"] == ["0", "1", "2", "3", "4"]
    assert rows["team_b_borrower_running"]["started_at"] is not None
    assert rows["team_b_borrower_running"]["expected_start"] is None  # only a waiting job has one
    assert rows["team_b_preempted_earlier"]["preemptions"] == 1
    assert rows["team_b_preempted_earlier"]["devices"] == []


def test_jobs_filtered_on_a_task_instance_are_its_own(server, jobs):
    query = "dag_id=quota_cases&run_id=seeded&task_id=team_a_pending_blocked&map_index=-1"
    status, body = server.request("GET", f"/quota/api/jobs?{query}", user="viewer")
    assert status == 200, body
    assert [(j["id"], j["pending_reason"]) for j in body["jobs"]] == [(str(jobs["team_a_pending_blocked"]), REASON_BLOCKED)]
    status, body = server.request("GET", f"/quota/api/jobs?{query.replace('map_index=-1', 'map_index=0')}", user="viewer")
    assert (status, body["jobs"]) == (200, [])


def test_an_unknown_job_state_is_refused_naming_the_allowed_ones(server, jobs):
    status, body = server.request("GET", "/quota/api/jobs?state=waiting", user="viewer")
    assert status == 400
    assert body["detail"] == "state: 'waiting' is not one of pending, running, stopping, preempted, finished, failed"


def test_events_are_paged_newest_first(server, jobs):
    status, first = server.request("GET", "/quota/api/events?limit=2", user="viewer")
    assert status == 200
    _, second = server.request("GET", "/quota/api/events?limit=2&offset=2", user="viewer")
    ids = [e["id"] for e in first["events"] + second["events"]]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == 4
    assert first["total_entries"] == second["total_entries"] >= 4

    _, preempted = server.request("GET", "/quota/api/events?kind=preempted", user="viewer")
    event = next(e for e in preempted["events"] if e["task_id"] == "team_b_preempted_earlier")
    assert (event["victim"], event["preemptor"], event["reason"]) == (
        str(jobs["team_b_preempted_earlier"]), str(jobs["team_a_running"]), "reclaim"
    )
    status, body = server.request("GET", "/quota/api/events?kind=nope", user="viewer")
    assert status == 400 and body["detail"].startswith("kind: 'nope' is not one of submitted, admitted")


def _priority(server, job_id: int) -> int:
    return server.instance.sql("SELECT priority FROM quota_job WHERE id=?", job_id)[0]["priority"]


def test_a_viewer_may_not_change_a_priority(server, jobs):
    job_id = jobs["team_a_pending_behind"]
    before = _priority(server, job_id)
    status, body = server.request("PATCH", f"/quota/api/jobs/{job_id}", {"priority": 99}, user="viewer")
    assert status == 403, body
    assert _priority(server, job_id) == before


def test_patch_priority_changes_the_row_and_writes_an_audit_event(server):
    job_id = server.seed({"case": "patch_priority_ok", "quota": "team-a", "priority": 20, "position": 3})[
        "patch_priority_ok"
    ]
    status, body = server.request("PATCH", f"/quota/api/jobs/{job_id}", {"priority": 90}, user="op")
    assert status == 200, body
    assert (body["id"], body["priority"], body["state"]) == (str(job_id), 90, "pending")
    assert _priority(server, job_id) == 90

    status, events = server.request("GET", f"/quota/api/events?kind=priority_changed&job_id={job_id}", user="viewer")
    assert status == 200
    (event,) = events["events"]
    assert (event["quota"], event["task_id"], event["message"]) == ("team-a", "patch_priority_ok", "priority 20 -> 90 by op (REST API)")


def test_a_priority_above_the_quotas_max_priority_is_refused_naming_it(server):
    job_id = server.seed({"case": "patch_above_max", "quota": "team-a", "priority": 20})["patch_above_max"]
    status, body = server.request("PATCH", f"/quota/api/jobs/{job_id}", {"priority": 101}, user="admin")
    assert status == 400
    assert body["detail"] == "priority: 101 is above quota team-a's max_priority 100"
    assert _priority(server, job_id) == 20


def test_patch_of_a_finished_job_conflicts(server, jobs):
    status, body = server.request(
        "PATCH", f"/quota/api/jobs/{jobs['team_b_preempted_earlier']}", {"priority": 7}, user="op"
    )
    assert status == 409
    assert "is finished" in body["detail"]


@pytest.mark.parametrize(
    ("path", "payload", "code"),
    [
        pytest.param("/quota/api/jobs/999999", {"priority": 1}, 404, id="unknown job"),
        pytest.param("/quota/api/jobs/abc", {"priority": 1}, 422, id="not a job id"),
        pytest.param(None, {"priority": "high"}, 422, id="priority not an integer"),
        pytest.param(None, {"priority": 1, "quota": "team-b"}, 422, id="only priority may change"),
    ],
)
def test_bad_patch_requests(server, jobs, path, payload, code):
    path = path or f"/quota/api/jobs/{jobs['team_a_pending_behind']}"
    status, body = server.request("PATCH", path, payload, user="op")
    assert status == code, body


def test_the_cli_and_the_api_change_priorities_through_the_same_function(server):
    ids = server.seed(
        {"case": "cli_priority_same_path", "quota": "team-a", "priority": 20},
    )
    job_id = ids["cli_priority_same_path"]
    server.instance.airflow("quota", "set-priority", "quota_cases", "seeded", "cli_priority_same_path", "60")
    refused = server.instance.airflow(
        "quota", "set-priority", "quota_cases", "seeded", "cli_priority_same_path", "101", check=False
    )
    status, api_refusal = server.request("PATCH", f"/quota/api/jobs/{job_id}", {"priority": 101}, user="op")

    assert _priority(server, job_id) == 60
    _, events = server.request("GET", f"/quota/api/events?kind=priority_changed&job_id={job_id}", user="viewer")
    assert [e["message"] for e in events["events"]] == [f"priority 20 -> 60 by {getpass.getuser()} (CLI)"]
    assert status == 400 and refused.returncode != 0
    assert api_refusal["detail"] in refused.stderr + refused.stdout


def test_an_unusable_quota_file_answers_503_naming_it(server, jobs):
    path = server.instance.quota_path
    good = path.read_text()
    try:
        path.write_text(good.replace("capacity: 8", "capacity: eight"))
        status, body = server.request("GET", "/quota/api/quotas", user="viewer")
        jobs_status, _ = server.request("GET", "/quota/api/jobs", user="viewer")
    finally:
        path.write_text(good)
    assert status == 503
    assert body["detail"].startswith(f"{path}: queues[0].capacity")
    assert jobs_status == 200  # job rows are still shown


def test_the_cli_and_the_api_charge_the_same_usage(server, jobs):
    since, until = int(time.time()) - 3600, int(time.time()) + 3600  # running jobs hold GPUs until `until`
    status, body = server.request("GET", f"/quota/api/usage?since={since}&until={until}", user="viewer")
    cli = server.instance.airflow("quota", "usage", "--since", str(since), "--until", str(until), "-o", "json")
    assert status == 200, body
    api_rows = {row["key"]: row for row in body["rows"]}
    cli_rows = {row["quota"]: row for row in json.loads(cli.stdout)}
    assert set(api_rows) == set(cli_rows) and any(row["used_within"] > 0 for row in cli_rows.values())
    for quota, row in cli_rows.items():
        assert {k: api_rows[quota][k] for k in ("capacity_s", "used_within", "borrowed", "lent", "idle", "lost")} == {
            k: row[k] for k in ("capacity_s", "used_within", "borrowed", "lent", "idle", "lost")}
        assert row["used_within"] + row["lent"] + row["idle"] == pytest.approx(row["capacity_s"])


def test_the_usage_series_adds_up_to_the_rows_and_the_csv_is_the_clis(server, jobs):
    since, until = int(time.time()) - 2 * 3600, int(time.time()) + 3600
    status, body = server.request("GET", f"/quota/api/usage?since={since}&until={until}&every=3600", user="viewer")
    assert status == 200, body
    (first,) = server.instance.sql("SELECT MIN(at) AS at FROM quota_event")
    start = max(since, first["at"])  # nothing is charged before the install's start
    assert len(body["series"]) == math.ceil(until / 3600) - math.floor(start / 3600)
    assert body["series"][-1]["until"] == body["until"]
    for row in body["rows"]:
        for kind in ("capacity_s", "used_within", "borrowed", "lent", "idle", "lost"):
            summed = sum(r[kind] for bucket in body["series"] for r in bucket["rows"] if r["key"] == row["key"])
            assert summed == pytest.approx(row[kind], abs=0.01), (row["key"], kind)
    status, text = server.request("GET", f"/quota/api/usage?since={since}&until={until}&format=csv", user="viewer")
    cli = server.instance.airflow("quota", "usage", "--since", str(since), "--until", str(until), "-o", "csv")
    assert status == 200 and text == cli.stdout and text.startswith("quota,capacity_s,used_within,"), text


TWO_DAYS_AHEAD = int(time.time()) + 2 * 86400
"""An ``until`` that the install's start (the seeded jobs' first event, in the past) is always more
than a day before: one-minute buckets from it are more than 1440."""


@pytest.mark.parametrize(
    ("query", "field"),
    [
        pytest.param("since=0&every=420", "every", id="every not a divisor of a day"),
        pytest.param(f"since=0&until={TWO_DAYS_AHEAD}&every=60", "every", id="too many buckets"),
        pytest.param("since=yesterday", "since", id="since not a time"),
        pytest.param("since=100&until=50", "until", id="until before since"),
    ],
)
def test_bad_usage_requests_name_the_field(server, jobs, query, field):
    status, body = server.request("GET", f"/quota/api/usage?{query}", user="viewer")
    assert status == 400 and body["detail"].startswith(f"{field}: "), body


def test_usage_since_the_epoch_is_charged_from_the_install_start(server, jobs):
    """``since=0`` asks for everything there is: the same figures as from a day before the seeded
    jobs' first event (the install's start), hourly buckets from there, nothing before it."""
    (first,) = server.instance.sql("SELECT MIN(at) AS at FROM quota_event")
    day_before, until = int(first["at"]) - 86400, int(time.time()) + 60
    status, everything = server.request("GET", f"/quota/api/usage?since=0&until={until}&every=3600", user="viewer")
    assert status == 200, everything
    status, from_day_before = server.request("GET", f"/quota/api/usage?since={day_before}&until={until}", user="viewer")
    assert status == 200 and everything["rows"] == from_day_before["rows"], (everything, from_day_before)
    assert everything["series"][0]["since"] == datetime.fromtimestamp(first["at"], timezone.utc).isoformat().replace(
        "+00:00", "Z")
    status, before = server.request("GET", f"/quota/api/usage?since=0&until={day_before}", user="viewer")
    assert status == 200 and before["rows"] == [], before


def test_the_usage_cli_names_a_bad_field_without_a_traceback(server):
    result = server.instance.airflow("quota", "usage", "--since", "yesterday", check=False)
    assert result.returncode == 2
    assert "Error: since: 'yesterday' is not an ISO 8601 time" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("args", "error"),
    [
        pytest.param(("usage", "--since", "nan"), "since: 'nan' is not a time from 1970", id="usage --since nan"),
        pytest.param(("usage", "--since", "0", "--until", "inf"), "until: 'inf' is not a time from 1970",
                     id="usage --until inf"),
        pytest.param(("usage", "--since", "0", "--until", "1e20"), "until: '1e20' is not a time from 1970",
                     id="usage --until past the year 9999"),
        pytest.param(("db-clean", "--older-than", "nan"), "older-than: nan is not a number of days from 0 to 36500",
                     id="db-clean --older-than nan"),
        pytest.param(("db-clean", "--older-than", "inf"), "older-than: inf is not a number of days from 0 to 36500",
                     id="db-clean --older-than inf"),
        pytest.param(("db-clean", "--older-than", "-1"), "older-than: -1.0 is not a number of days from 0 to 36500",
                     id="db-clean --older-than negative"),
    ],
)
def test_the_cli_refuses_a_time_that_is_not_one_naming_the_option_without_a_traceback(server, jobs, args, error):
    before = server.instance.sql("SELECT COUNT(*) AS n FROM quota_event")
    result = server.instance.airflow("quota", *args, check=False)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert f"Error: {error}" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert server.instance.sql("SELECT COUNT(*) AS n FROM quota_event") == before  # db-clean deleted nothing


# ---------------------------------------------------------------------------------- hostile input


def _raw(server, method: str, path: str, data: bytes | None = None, *, user: str = "op", chunked: bool = False) -> tuple[int, bytes]:
    """(status, raw body) of a request whose body is sent exactly as given (NaN, 1e400, huge numbers);
    ``chunked``: in 64 KiB chunks without a Content-Length."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.token(user)}"}
    if chunked and data is not None:
        data = iter([data[i : i + 65536] for i in range(0, len(data), 65536)])
    req = urllib.request.Request(server.base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _priorities(server) -> dict[int, int]:
    return {row["id"]: row["priority"] for row in server.instance.sql("SELECT id, priority FROM quota_job")}


@pytest.fixture(scope="module")
def uncapped_job(server) -> int:
    """A waiting job of team-b, which has no max_priority: only the API's own bounds apply to it."""
    return server.seed({"case": "hostile_patch_uncapped", "quota": "team-b", "priority": 20})["hostile_patch_uncapped"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"priority": "50"}', id="a string of digits"),
        pytest.param(b'{"priority": true}', id="a boolean"),
        pytest.param(b'{"priority": 50.5}', id="a fraction"),
        pytest.param(b'{"priority": NaN}', id="NaN"),
        pytest.param(b'{"priority": Infinity}', id="Infinity"),
        pytest.param(b'{"priority": 1e400}', id="1e400, beyond a double"),
        pytest.param(b'{"priority": 9223372036854775808}', id="beyond 64-bit"),
        pytest.param(b'{"priority": 2147483648}', id="beyond the 32-bit priority range"),
        pytest.param(b'{"priority": -2147483649}', id="below the 32-bit priority range"),
        pytest.param(b'{"priority": null}', id="null"),
    ],
)
def test_a_priority_that_is_not_a_bounded_integer_is_refused_naming_the_field(server, uncapped_job, body):
    before = _priority(server, uncapped_job)
    status, raw = _raw(server, "PATCH", f"/quota/api/jobs/{uncapped_job}", body)
    assert status == 422, raw[:500]
    (error,) = json.loads(raw)["detail"]
    assert error["loc"] == ["body", "priority"]
    assert _priority(server, uncapped_job) == before


def test_a_priority_at_the_bounds_and_one_written_as_50_0_are_integers(server, uncapped_job):
    for body, expected in ((b'{"priority": 2147483647}', 2147483647), (b'{"priority": -2147483648}', -2147483648),
                           (b'{"priority": 50.0}', 50)):
        status, raw = _raw(server, "PATCH", f"/quota/api/jobs/{uncapped_job}", body)
        assert status == 200, raw[:500]
        assert _priority(server, uncapped_job) == expected


@pytest.mark.parametrize("chunked", [pytest.param(False, id="Content-Length"), pytest.param(True, id="chunked")])
def test_a_body_over_1_mib_is_refused_with_413_before_it_is_read(server, uncapped_job, chunked):
    before = _priority(server, uncapped_job)
    body = json.dumps({"priority": 5, "padding": "x" * (1 << 20)}).encode()
    status, raw = _raw(server, "PATCH", f"/quota/api/jobs/{uncapped_job}", body, chunked=chunked)
    assert status == 413, raw[:500]
    assert json.loads(raw) == {"detail": "request body larger than 1048576 bytes"}
    assert _priority(server, uncapped_job) == before


def test_a_priority_of_5000_digits_is_refused_without_a_server_error(server, uncapped_job):
    status, raw = _raw(server, "PATCH", f"/quota/api/jobs/{uncapped_job}", b'{"priority": 1' + b"0" * 5000 + b"}")
    assert status in (400, 422), raw[:500]
    assert len(raw) < 2000


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"priority": "9" * 1_000_000}, id="a 1 MB priority"),
        pytest.param({"p" * 1_000_000: 1, "priority": 1}, id="a 1 MB field name"),
    ],
)
def test_a_huge_body_is_not_echoed_back(server, uncapped_job, body):
    status, raw = _raw(server, "PATCH", f"/quota/api/jobs/{uncapped_job}", json.dumps(body).encode())
    assert status == 422
    assert len(raw) < 2000, f"{len(raw)} bytes echoed"
    assert json.loads(raw)["detail"][0]["loc"][0] == "body"


@pytest.mark.parametrize(
    "job_id",
    [
        pytest.param("\u00b2", id="superscript two"),
        pytest.param("\u2460", id="circled one"),
        pytest.param("\u0661", id="arabic-indic one"),
        pytest.param("\uff11", id="fullwidth one"),
        pytest.param("9" * 5000, id="5000 digits"),
        pytest.param(str(2**63), id="beyond 64-bit"),
        pytest.param(str(2**31), id="beyond the id column"),
        pytest.param("-1", id="negative"),
        pytest.param("+1", id="a plus sign"),
        pytest.param(" 1", id="a space"),
        pytest.param("1_0", id="an underscore"),
        pytest.param("0x1", id="hexadecimal"),
        pytest.param("1\n", id="a trailing newline"),
    ],
)
def test_a_job_id_that_is_not_ascii_decimal_in_range_names_no_job(server, jobs, job_id):
    before = _priorities(server)
    status, raw = _raw(
        server, "PATCH", f"/quota/api/jobs/{urllib.parse.quote(job_id, safe='')}", b'{"priority": 7}'
    )
    assert status in (404, 422), raw[:500]
    assert len(raw) < 2000
    assert _priorities(server) == before  # in particular "\u0661" is not job 1


@pytest.mark.parametrize(
    "query",
    [
        pytest.param("job_id=" + urllib.parse.quote("\u00b2"), id="job_id superscript two"),
        pytest.param("job_id=" + urllib.parse.quote("\u0661"), id="job_id arabic-indic one"),
        pytest.param("job_id=" + "9" * 5000, id="job_id of 5000 digits"),
        pytest.param(f"job_id={2**63}", id="job_id beyond 64-bit"),
        pytest.param(f"offset={2**63}", id="offset beyond 64-bit"),
        pytest.param(f"offset={10**30}", id="offset of 31 digits"),
        pytest.param("kind=", id="an empty kind"),
    ],
)
def test_event_filters_out_of_range_are_refused_without_a_server_error(server, jobs, query):
    status, raw = _raw(server, "GET", f"/quota/api/events?{query}", user="viewer")
    assert status in (400, 422), raw[:500]
    assert len(raw) < 2000


@pytest.mark.parametrize(
    ("query", "status", "field"),
    [
        # since and until: parsed by usage_report.parse_time, answered 400 naming the field and the range
        pytest.param("since=nan", 400, "since", id="since NaN"),
        pytest.param("since=-Infinity", 400, "since", id="since minus infinity"),
        pytest.param("since=1e400", 400, "since", id="since 1e400, beyond a double"),
        pytest.param("since=-1", 400, "since", id="since negative"),
        pytest.param("since=" + "9" * 60, 400, "since", id="since of 60 digits"),
        pytest.param("since=0001-01-01T00:00:00%2B05:00", 400, "since", id="since before 1970 east of UTC"),
        pytest.param("since=", 400, "since", id="an empty since"),
        pytest.param("since=0&until=NaN", 400, "until", id="until NaN"),
        pytest.param("since=0&until=inf", 400, "until", id="until infinity"),
        pytest.param("since=0&until=1e20", 400, "until", id="until past the year 9999"),
        pytest.param("since=0&until=253402300800", 400, "until", id="until one second past the year 9999"),
        pytest.param("since=0&until=9999-12-31T23:59:59-05:00", 400, "until", id="until in the year 10000 UTC"),
        pytest.param("since=10&until=-10", 400, "until", id="until negative"),
        pytest.param("since=0&until=253402300799", 400, "until", id="until over 3660 days after the install"),
        # every, format, by: typed query parameters, answered 422 naming the field (as every schema error)
        pytest.param("since=0&every=nan", 422, "every", id="every NaN"),
        pytest.param("since=0&every=inf", 422, "every", id="every infinity"),
        pytest.param("since=0&every=-3600", 422, "every", id="every negative"),
        pytest.param("since=0&every=0", 422, "every", id="every zero"),
        pytest.param("since=0&every=172800", 422, "every", id="every over a day"),
        pytest.param("since=0&every=3600.5", 422, "every", id="every a fraction"),
        pytest.param(f"since=0&every={2**63}", 422, "every", id="every beyond 64-bit"),
        pytest.param("since=0&every=" + "9" * 5000, 422, "every", id="every of 5000 digits"),
        pytest.param("since=0&format=xlsx", 422, "format", id="format unknown"),
        pytest.param("since=0&format=", 422, "format", id="an empty format"),
        pytest.param("since=0&format=" + "c" * 5000, 422, "format", id="a format of 5000 characters"),
        pytest.param("since=" + "1" * 5000, 422, "since", id="a since of 5000 characters"),
        pytest.param("since=0&by=team", 422, "by", id="by unknown"),
    ],
)
def test_hostile_usage_queries_are_refused_naming_the_field_without_a_server_error(server, jobs, query, status, field):
    got, raw = _raw(server, "GET", f"/quota/api/usage?{query}", user="viewer")
    assert got == status, raw[:500]
    assert len(raw) < 2000
    detail = json.loads(raw)["detail"]
    if status == 400:
        assert detail.startswith(f"{field}: "), detail
    else:
        assert [error["loc"] for error in detail] == [["query", field]], detail


@pytest.mark.parametrize(
    "query",
    [
        pytest.param(f"offset={2**63}", id="offset beyond 64-bit"),
        pytest.param("state=", id="an empty state"),
        pytest.param("state=" + "x" * 5000, id="a state of 5000 characters"),
        pytest.param("map_index=-2", id="a map index below -1"),
        pytest.param(f"map_index={2**31}", id="a map index beyond the column"),
        pytest.param("run_id=" + "r" * 251, id="a run id longer than the column"),
        pytest.param("run_id=a%00b", id="a NUL in a run id (PostgreSQL refuses it)"),
        pytest.param("quota=team-a%00", id="a NUL in a quota"),
    ],
)
def test_job_filters_out_of_range_are_refused_without_a_server_error(server, jobs, query):
    status, raw = _raw(server, "GET", f"/quota/api/jobs?{query}", user="viewer")
    assert status in (400, 422), raw[:500]
    assert len(raw) < 2000


def test_a_running_gang_lists_its_nodes_hosts_and_each_nodes_devices(server, jobs):
    (gang,) = server.seed({"case": "api_gang_running", "quota": "team-lab", "gpus": 2, "nodes": 2, "state": "running",
                           "hosts": [["gpu-b", ["1"]], ["gpu-a", ["0"]]]}).values()
    try:
        status, body = server.request("GET", "/quota/api/jobs?task_id=api_gang_running", user="viewer")
        assert status == 200, body
        (job,) = body["jobs"]
        assert (job["nodes"], job["gpus"], job["host"], job["hosts"]) == (2, 2, "gpu-b", ["gpu-b", "gpu-a"])
        assert job["devices"] == ["1"]  # node 0's, on its host
        assert job["placement"] == [{"host": "gpu-b", "devices": ["1"]}, {"host": "gpu-a", "devices": ["0"]}]
        _, one_host = server.request("GET", "/quota/api/jobs?task_id=team_b_borrower_running", user="viewer")
        (borrower,) = one_host["jobs"]
        assert (borrower["nodes"], borrower["hosts"]) == (1, ["local"])
        assert borrower["placement"] == [{"host": "local", "devices": ["0", "1", "2", "3", "4"]}]
    finally:
        server.finish(gang)
    _, body = server.request("GET", "/quota/api/jobs?task_id=api_gang_running&state=finished", user="viewer")
    assert (body["jobs"][0]["hosts"], body["jobs"][0]["placement"]) == ([], [])

    _, schema = server.request("GET", "/quota/api/openapi.json", user="viewer")
    job_schema = schema["components"]["schemas"]["JobResponse"]
    assert {"nodes", "hosts", "placement"} <= set(job_schema["required"])
    assert all(job_schema["properties"][f]["description"] for f in ("nodes", "hosts", "placement"))
    assert set(schema["components"]["schemas"]["NodePlacement"]["properties"]) == {"host", "devices"}
