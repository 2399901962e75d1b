"""The quota page in a real browser: Debian's headless chromium logs into the Airflow UI, opens the
page from the navigation, and finds the quotas, their bars, a pending reason and a preemption."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from tests.quota_api_support import PASSWORDS, REASON_BLOCKED

DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "ui-quota-page.png"
UPDATE_DOCS_ENV = "QUOTA_UPDATE_DOCS_SCREENSHOT"
"""Set to 1 to copy this run's screenshot over the README's (tracked) one; otherwise it stays in
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


def test_quota_page_in_the_airflow_ui_shows_quotas_bars_pending_reasons_and_preemptions(
    server, browser, tmp_path
):
    jobs = server.baseline()
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
    assert blocked.find_element(By.CSS_SELECTOR, "td").text == "1"  # position
    link = blocked.find_element(By.TAG_NAME, "a")
    assert link.get_attribute("href").endswith("/dags/quota_cases/runs/seeded/tasks/team_a_pending_blocked")

    team_b = browser.find_element(By.CSS_SELECTOR, "[data-quota='team-b']")
    widths = {
        kind: team_b.find_element(By.CSS_SELECTOR, f".seg.{kind}").get_attribute("style")
        for kind in ("owned", "borrowed", "lent", "idle")
    }
    assert widths["borrowed"] != "width: 0%;" and widths["lent"] == "width: 0%;"

    preemptions = browser.find_element(By.ID, "preemptions").text
    assert "quota_cases.team_b_preempted_earlier (seeded)" in preemptions
    assert "quota_cases.team_a_running (seeded)" in preemptions and "reclaim" in preemptions

    browser.switch_to.default_content()
    shot = tmp_path / "ui-quota-page.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get(UPDATE_DOCS_ENV) == "1":
        shutil.copyfile(shot, DOCS_SCREENSHOT)


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
