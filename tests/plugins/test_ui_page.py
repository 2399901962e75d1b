"""The quota page in a real browser: Debian's headless chromium logs into the Airflow UI, opens the
page from the navigation, and finds the quotas, their bars, a pending reason, a preemption, the usage
charts drawn from GET /quota/api/usage, and the chargeback CSV it downloads."""

from __future__ import annotations

import csv
import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from airflow_quota_provider.operators.links import quota_page_url
from tests.plugins.seed import DAG_ID, RUN_ID
from tests.quota_api_support import PASSWORDS, REASON_BLOCKED

DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "ui-quota-page.png"
DOCS_USAGE_SCREENSHOT = DOCS_SCREENSHOT.with_name("ui-usage-charts.png")
UPDATE_DOCS_ENV = "QUOTA_UPDATE_DOCS_SCREENSHOT"
"""Set to 1 to copy this run's screenshots over the docs' (tracked) ones; otherwise they stay in
the test's temporary directory and a test run leaves the working tree as it found it."""
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1366,768",  # a laptop screen
)


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"download.default_directory": str(tmp_path / "downloads"),
                                              "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _log_in(browser, server, user: str) -> None:
    browser.get(f"{server.base}/auth/login")
    wait = WebDriverWait(browser, 60)
    wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys(user)
    browser.find_element(By.NAME, "password").send_keys(PASSWORDS[user])
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda d: "/auth/login" not in d.current_url)


HOUR, DAY = 3600, 86400
USAGE_HISTORY = (
    # Never more than the gpu-fleet's 8 GPUs at once; team-b borrows 2 of team-a's for 3 hours.
    {"case": "usage_team_a_history", "quota": "team-a", "gpus": 3, "held": [[5 * DAY, 4.5 * DAY], [30 * HOUR, 20 * HOUR]]},
    {"case": "usage_team_b_history", "quota": "team-b", "gpus": 6, "held": [[3 * DAY, 2 * DAY], [12 * HOUR, 9 * HOUR]]},
    {"case": "usage_team_lab_history", "quota": "team-lab", "gpus": 2, "held": [[8 * HOUR, 1 * HOUR]]},
)


def _chart_geometry(browser) -> dict[tuple[str, str], dict[str, tuple[float, float]]]:
    """(quota, span) -> each series' drawn (width, height) in pixels, from the SVG the page drew."""
    return {
        (chart.get_attribute("data-usage"), chart.get_attribute("data-span")): {
            path.get_attribute("data-kind"): tuple(browser.execute_script(
                "const b = arguments[0].getBoundingClientRect(); return [b.width, b.height];", path))
            for path in chart.find_elements(By.CSS_SELECTOR, "path.series")
        }
        for chart in browser.find_elements(By.CSS_SELECTOR, "svg.usage-chart")
    }


def _downloaded(directory: Path) -> Path:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = [p for p in directory.glob("*.csv")] if directory.exists() else []
        if done:
            return done[0]
        time.sleep(0.2)
    raise AssertionError(f"no CSV downloaded into {directory}: {list(directory.glob('*')) if directory.exists() else []}")


def test_quota_page_in_the_airflow_ui_shows_quotas_bars_pending_reasons_and_preemptions(
    server, browser, tmp_path
):
    jobs = server.baseline()
    server.seed(*USAGE_HISTORY)
    _log_in(browser, server, "viewer")
    wait = WebDriverWait(browser, 60)

    wait.until(ec.element_to_be_clickable((By.XPATH, "//*[normalize-space(text())='Browse']"))).click()
    wait.until(ec.element_to_be_clickable((By.XPATH, "//*[normalize-space(text())='GPU quotas']"))).click()
    frame = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "iframe[src$='/quota/ui/']")))
    assert "/plugin/gpu-quotas" in browser.current_url
    browser.switch_to.frame(frame)

    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "[data-quota='team-a'] tr[data-job]")))
    quotas = [e.get_attribute("data-quota") for e in browser.find_elements(By.CSS_SELECTOR, "[data-quota]")]
    assert quotas == ["team-a", "team-b", "team-lab"]

    team_a = browser.find_element(By.CSS_SELECTOR, "[data-quota='team-a']")
    assert "capacity 4 · owned 2 · borrowed 0 · lent 1 · idle 1 · can start now 1" in team_a.text
    blocked = team_a.find_element(By.CSS_SELECTOR, f"tr[data-job='{jobs['team_a_pending_blocked']}']")
    assert REASON_BLOCKED in blocked.text
    # Seeded 730 s ahead when the session started: the page says what is left of it now.
    starts_in = re.search(r"expected to start in about (\d+) min", blocked.text)
    assert starts_in and 1 <= int(starts_in.group(1)) <= 12, blocked.text
    assert blocked.find_element(By.CSS_SELECTOR, "td").text == "1"  # position
    link = blocked.find_element(By.TAG_NAME, "a")
    assert link.get_attribute("href").endswith("/dags/quota_cases/runs/seeded/tasks/team_a_pending_blocked")

    team_b = browser.find_element(By.CSS_SELECTOR, "[data-quota='team-b']")
    widths = {
        kind: team_b.find_element(By.CSS_SELECTOR, f".seg.{kind}").get_attribute("style")
        for kind in ("owned", "borrowed", "lent", "idle")
    }
    assert widths["borrowed"] != "width: 0%;" and widths["lent"] == "width: 0%;"

    assert browser.find_elements(By.CSS_SELECTOR, "form.set-priority") == []  # a viewer may not edit pools

    # Running jobs, from GET /quota/api/jobs: team-b's job holds 4 of its own GPUs and 1 of team-a's.
    borrower = wait.until(ec.presence_of_element_located(
        (By.CSS_SELECTOR, f"#running tr[data-job='{jobs['team_b_borrower_running']}']")))
    assert "4 + 1 borrowed" in borrower.text and "local: 0,1,2,3,4" in borrower.text, borrower.text
    assert borrower.find_element(By.CSS_SELECTOR, "td.reclaim").text == "yes"
    owner = browser.find_element(By.CSS_SELECTOR, f"#running tr[data-job='{jobs['team_a_running']}']")
    assert owner.find_element(By.CSS_SELECTOR, "td.reclaim").text == "no"
    assert owner.find_element(By.TAG_NAME, "a").get_attribute("href").endswith("/runs/seeded/tasks/team_a_running")

    # The audit log filtered on the victim shows its preemption; on team-a too (the victim's quota is team-b), not.
    filters = browser.find_element(By.ID, "audit-filters")
    filters.find_element(By.NAME, "job_id").send_keys(str(jobs["team_b_preempted_earlier"]))
    filters.find_element(By.CSS_SELECTOR, "button").click()
    audit = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#events tr[data-kind='preempted']")))
    assert f"job {jobs['team_b_preempted_earlier']} stopped for job {jobs['team_a_running']}" in audit.text
    Select(filters.find_element(By.NAME, "quota")).select_by_value("team-a")
    filters.find_element(By.CSS_SELECTOR, "button").click()
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, "#events tr[data-kind='preempted']"))

    preemptions = browser.find_element(By.ID, "preemptions").text
    assert "quota_cases.team_b_preempted_earlier (seeded)" in preemptions
    assert "quota_cases.team_a_running (seeded)" in preemptions and "reclaim" in preemptions

    # Usage: one chart per quota and span, four series each; what was held has an area.
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "svg.usage-chart[data-span='week']")))
    geometry = _chart_geometry(browser)
    assert set(geometry) == {(q, span) for q in quotas for span in ("hour", "day", "week")}
    assert all(set(series) == {"owned", "lent", "idle", "borrowed"} for series in geometry.values())
    for quota, span, kind in (("team-a", "week", "owned"), ("team-a", "day", "lent"), ("team-b", "day", "borrowed"),
                              ("team-b", "week", "borrowed"), ("team-lab", "day", "owned")):
        width, height = geometry[quota, span][kind]
        assert width > 0 and height > 0, (quota, span, kind, geometry[quota, span])
    assert geometry["team-lab", "week"]["borrowed"][1] < 0.01  # team-lab reserves: it never borrows (0 but for rounding)

    # The chargeback CSV downloads the table's period with the API's figures.
    link = browser.find_element(By.ID, "csv")
    query = link.get_attribute("href").split("?", 1)[1]
    link.click()
    with _downloaded(tmp_path / "downloads").open() as f:
        downloaded = {row["quota"]: row for row in csv.DictReader(f)}
    status, body = server.request("GET", f"/quota/api/usage?{query.replace('&format=csv', '')}", user="viewer")
    assert status == 200, body
    assert set(downloaded) == {row["key"] for row in body["rows"]} == set(quotas)
    for row in body["rows"]:
        for kind in ("capacity_s", "used_within", "borrowed", "lent", "idle", "lost"):
            assert float(downloaded[row["key"]][kind]) == row[kind], (row["key"], kind)
        shown = browser.find_element(By.CSS_SELECTOR, f"#chargeback tr[data-key='{row['key']}']").text.split()
        assert shown[1:] == [f"{row[k] / 3600:.2f}" for k in ("capacity_s", "used_within", "borrowed", "lent", "idle", "lost")]

    usage_shot = tmp_path / "ui-usage-charts.png"
    usage = browser.find_element(By.ID, "usage")
    browser.execute_script("arguments[0].scrollIntoView()", usage)
    assert usage.screenshot(str(usage_shot))

    browser.execute_script("window.scrollTo(0, 0)")  # the page as it opens: the bars first
    browser.switch_to.default_content()
    # The page takes Airflow's color mode (the class of the UI's <html>), and follows a switch.
    background = "return getComputedStyle(document.querySelector('iframe').contentDocument.body).backgroundColor"
    mode = browser.execute_script("return document.documentElement.classList.contains('dark') ? 'dark' : 'light'")
    colors = {"light": "rgb(255, 255, 255)", "dark": "rgb(26, 32, 44)"}
    assert browser.execute_script(background) == colors[mode]
    other = {"light": "dark", "dark": "light"}[mode]
    browser.execute_script(f"document.documentElement.classList.replace('{mode}', '{other}')")
    wait.until(lambda d: d.execute_script(background) == colors[other])
    browser.execute_script(f"document.documentElement.classList.replace('{other}', '{mode}')")
    shot = tmp_path / "ui-quota-page.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get(UPDATE_DOCS_ENV) == "1":
        shutil.copyfile(shot, DOCS_SCREENSHOT)
        shutil.copyfile(usage_shot, DOCS_USAGE_SCREENSHOT)


def test_quota_page_refreshes_itself(server, browser):
    server.baseline()
    _log_in(browser, server, "viewer")
    browser.get(f"{server.base}/quota/ui/")
    wait = WebDriverWait(browser, 60)
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "[data-quota='team-lab']")))
    assert browser.find_elements(By.CSS_SELECTOR, "[data-quota='team-lab'] tr[data-job]") == []

    server.seed({"case": "ui_refresh_new_waiter", "quota": "team-lab", "gpus": 1, "reason": "seen after a refresh"})
    row = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "[data-quota='team-lab'] tr[data-job]")))
    assert "seen after a refresh" in row.text


def test_an_operator_changes_a_priority_in_the_page_and_is_told_why_a_value_is_refused(server, browser):
    server.baseline()
    (job,) = server.seed({"case": "ui_priority_edit", "quota": "team-a", "gpus": 1, "priority": 20, "position": 3}).values()
    _log_in(browser, server, "op")
    browser.get(f"{server.base}/quota/ui/")
    wait = WebDriverWait(browser, 60, ignored_exceptions=[StaleElementReferenceException])  # redrawn every 5 s
    form = f"form.set-priority[data-job='{job}']"

    def type_in(value: str) -> bool:
        field = browser.find_element(By.CSS_SELECTOR, f"{form} input")
        field.clear()
        field.send_keys(value)  # focused: the page holds its redraws until it is sent
        return True

    def submit(value: str) -> str:
        wait.until(lambda d: type_in(value))
        browser.find_element(By.CSS_SELECTOR, f"{form} button").click()
        return wait.until(lambda d: d.find_element(By.ID, "notice").text or None)

    row = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f"tr[data-job='{job}']")))
    assert "at most 100" in row.text
    refused = submit("101")
    assert refused == f"Job {job}: priority not changed: priority: 101 is above quota team-a's max_priority 100", refused
    browser.execute_script("document.getElementById('notice').textContent = ''")
    assert submit("60") == f"Job {job}: priority 20 → 60."
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f"{form} input").get_attribute("value") == "60")

    # The audit log, filtered on the job: who changed what, and when.
    filters = browser.find_element(By.ID, "audit-filters")
    Select(filters.find_element(By.NAME, "kind")).select_by_visible_text("priority changes")
    filters.find_element(By.NAME, "job_id").send_keys(str(job))
    filters.find_element(By.CSS_SELECTOR, "button").click()
    wait.until(lambda d: [r.get_attribute("data-kind") for r in d.find_elements(By.CSS_SELECTOR, "#events tr[data-kind]")]
               == ["priority_changed"])
    assert "priority 20 -> 60 by op (REST API)" in browser.find_element(By.CSS_SELECTOR, "#events tr[data-kind]").text


def test_charts_follow_the_quota_files_order_have_ticks_and_an_error_stays_until_its_next_load(server, browser):
    server.baseline()
    original = server.instance.quota_path.read_text()
    # team-b before team-a: the file's order is no longer the names' order.
    server.instance.quota_path.write_text(original.replace(
        "      - {name: team-a, capacity: 4, max_priority: 100}\n      - {name: team-b, capacity: 4, sharing: lend_and_borrow, borrow_limit: 4}\n",
        "      - {name: team-b, capacity: 4, sharing: lend_and_borrow, borrow_limit: 4}\n      - {name: team-a, capacity: 4, max_priority: 100}\n",
    ))
    try:
        _log_in(browser, server, "viewer")
        browser.get(f"{server.base}/quota/ui/")
        wait = WebDriverWait(browser, 60)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "svg.usage-chart[data-span='week']")))
        order = ["team-b", "team-a", "team-lab"]
        assert [e.get_attribute("data-quota") for e in browser.find_elements(By.CSS_SELECTOR, "[data-quota]")] == order
        charts = browser.find_elements(By.CSS_SELECTOR, "svg.usage-chart")
        assert [c.get_attribute("data-usage") for c in charts][::3] == order
        assert [r.get_attribute("data-key") for r in browser.find_elements(By.CSS_SELECTOR, "#chargeback tbody tr")] == order
        for chart in charts:
            span = chart.get_attribute("data-span")
            times = [t.text for t in chart.find_elements(By.CSS_SELECTOR, "text")]
            expected = {"hour": ["-15 min", "-30 min", "-45 min", "-60 min"], "day": ["-6 h", "-12 h", "-18 h", "-24 h"],
                        "week": ["-1 d", "-2 d", "-3 d", "-4 d", "-5 d", "-6 d", "-7 d"]}[span]
            assert all(t in times for t in expected) and "now" in times and "0" in times, (span, times)
    finally:
        server.instance.quota_path.write_text(original)

    # A failed usage load stays shown across the quota refreshes that succeed meanwhile (every 5 s) ...
    browser.execute_script("""
        window.realFetch = window.fetch;
        window.fetch = (url, options) => String(url).includes("api/usage")
            ? Promise.resolve(new Response(JSON.stringify({detail: "usage is down"}), {status: 503}))
            : window.realFetch(url, options);
        refreshUsage();""")
    error = browser.find_element(By.ID, "error")
    wait.until(lambda d: error.text == "Could not load usage: usage 503: usage is down")
    shown = browser.find_element(By.ID, "updated").text
    wait.until(lambda d: d.find_element(By.ID, "updated").text != shown)
    assert error.is_displayed() and error.text == "Could not load usage: usage 503: usage is down"
    # ... until usage loads again.
    browser.execute_script("window.fetch = window.realFetch; refreshUsage();")
    wait.until(lambda d: not error.is_displayed())


def test_the_task_instance_link_opens_the_page_on_its_job_its_reason_and_its_preemptions(server, browser):
    server.baseline()
    reason = "quota team-a full: 4/4 GPUs in use or lent"
    seeded = server.seed(
        {"case": "ti_link_preemptor", "quota": "team-a", "state": "finished"},
        {"case": "ti_link_waiting", "quota": "team-a", "priority": 5, "position": 4, "reason": reason,
         "starts_in_s": 1800, "preemptions": 1, "preempted_by": "ti_link_preemptor", "preempt_reason": "within_quota"},
    )
    job, preemptor = seeded["ti_link_waiting"], seeded["ti_link_preemptor"]
    _log_in(browser, server, "viewer")
    # The link's own URL, on the test's api-server.
    browser.get(f"{server.base}/quota/ui/?{urlsplit(quota_page_url(DAG_ID, RUN_ID, 'ti_link_waiting', -1)).query}")
    wait = WebDriverWait(browser, 60)
    facts = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, f"#ti-job[data-job='{job}']")))
    text = facts.text
    assert f"Why it waits {reason}" in text and "Position 4" in text and "State pending" in text, text
    assert re.search(r"Start expected to start in about (2\d|30) min", text), text
    assert "Preemptions 1 of" in text, text
    assert browser.find_element(By.ID, "ti-name").text == f"{DAG_ID}.ti_link_waiting ({RUN_ID}) · job {job}"

    # The audit log is filtered to the job: its preemption, nobody else's events.
    form = browser.find_element(By.ID, "audit-filters")
    assert form.find_element(By.NAME, "job_id").get_attribute("value") == str(job)
    audit = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#events tr[data-kind='preempted']")))
    assert f"job {job} stopped for job {preemptor}" in audit.text and "within_quota" in audit.text
    assert {e.get_attribute("data-kind") for e in browser.find_elements(By.CSS_SELECTOR, "#events tr[data-kind]")} == {
        "preempted"}


def test_a_gang_shows_its_hosts_with_each_nodes_devices_and_its_gpus_per_node(server, browser):
    server.baseline()
    seeded = server.seed(
        {"case": "ui_gang_running", "quota": "team-lab", "gpus": 2, "nodes": 2, "state": "running",
         "hosts": [["gpu-b", ["1"]], ["gpu-a", ["0"]]]},
        {"case": "ui_gang_waiting", "quota": "team-a", "gpus": 4, "nodes": 2, "position": 5,
         "reason": "needs 2 hosts with 2 GPUs free, 1 has (gpu-c)"},
    )
    running, waiting = seeded["ui_gang_running"], seeded["ui_gang_waiting"]
    try:
        _log_in(browser, server, "viewer")
        browser.get(f"{server.base}/quota/ui/?{urlsplit(quota_page_url(DAG_ID, RUN_ID, 'ui_gang_running', -1)).query}")
        wait = WebDriverWait(browser, 60)
        facts = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, f"#ti-job[data-job='{running}']")))
        assert "Hosts: devices gpu-b: 1 · gpu-a: 0" in facts.text and "GPUs 2 (2 nodes × 1)" in facts.text, facts.text
        row = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f"#running tr[data-job='{running}']")))
        assert row.find_element(By.CSS_SELECTOR, "td.placement").text == "gpu-b: 1 · gpu-a: 0"
        pending = wait.until(ec.presence_of_element_located(
            (By.CSS_SELECTOR, f"[data-quota='team-a'] tr[data-job='{waiting}']")))
        assert "4 (2 nodes × 2)" in pending.text and "needs 2 hosts with 2 GPUs free" in pending.text, pending.text
    finally:
        server.finish(running)


def test_a_typed_queue_shows_its_types_and_each_quotas_and_cohorts_figures_per_type(server, browser):
    """The shared api-server's lab queue made typed, its quota in a cohort, for this test (the quota
    file is read on every request), with the same quota and the same GPUs in all, so what it leaves is
    a finished job."""
    server.baseline()
    original = server.instance.quota_path.read_text()
    typed = original.replace("capacity: 2\n", "capacity: {l4: 1, t4: 1}\n    cohorts: [{name: labs}]\n", 1).replace(
        "{name: team-lab, capacity: 2,", "{name: team-lab, capacity: {l4: 1, t4: 1}, cohort: labs,", 1)
    assert typed.count("{l4: 1, t4: 1}") == 2 and typed.count("labs") == 2
    server.instance.quota_path.write_text(typed)
    (job,) = server.seed({"case": "ui_typed_running", "quota": "team-lab", "gpus": 1, "state": "running",
                          "gpu_type": "l4", "devices": ["15"]}).values()
    try:
        _log_in(browser, server, "viewer")
        browser.get(f"{server.base}/quota/ui/?{urlsplit(quota_page_url(DAG_ID, RUN_ID, 'ui_typed_running', -1)).query}")
        wait = WebDriverWait(browser, 60, ignored_exceptions=[StaleElementReferenceException])  # redrawn every 5 s
        lines = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-quota='team-lab'] .type[data-gpu-type]"))
        assert [line.get_attribute("data-gpu-type") for line in lines] == ["l4", "t4"]
        assert "capacity 1 · owned 1 · borrowed 0 · lent 0 · idle 0 · can start now 0" in lines[0].text, lines[0].text
        assert "capacity 1 · owned 0 · borrowed 0 · lent 0 · idle 1 · can start now 1" in lines[1].text, lines[1].text
        lab = browser.find_element(By.CSS_SELECTOR, "[data-queue='lab'] .queue-types").text
        assert lab.startswith("GPU types, in order: l4: 1 · t4: 1 (when it can borrow: borrow;"), lab
        assert browser.find_elements(By.CSS_SELECTOR, "[data-queue='gpu-fleet'] .queue-types, [data-quota='team-a'] .type") == []
        cohort = browser.find_elements(By.CSS_SELECTOR, "[data-cohort='labs'] > .types > [data-gpu-type]")
        assert [line.text for line in cohort] == ["l4: 1 of 1 GPUs in use · borrowed 0 · lent 0",
                                                  "t4: 0 of 1 GPUs in use · borrowed 0 · lent 0"]
        facts = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, f"#ti-job[data-job='{job}']")))
        assert "GPU type l4 (any type)" in facts.text, facts.text
        row = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f"#running tr[data-job='{job}']")))
        assert row.find_element(By.CSS_SELECTOR, ".gpu-type").text == "l4"
    finally:
        server.instance.quota_path.write_text(original)
        server.finish(job)
