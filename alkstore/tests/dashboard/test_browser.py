"""The dashboard in a real browser: Playwright driving Debian's chromium
(``/usr/bin/chromium``; Playwright cannot download its own here) against
the live dashboards of both engines. Without chromium or Playwright these
tests skip, saying so; in CI (``CI=true``) they fail instead.

With ``ALKSTORE_SCREENSHOTS=DIR`` each page's full screenshot is written
to ``DIR/dashboard-PAGE-ENGINE.png`` (docs/operations.md embeds them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Live
from dashhelpers import CHROMIUM, HOSTILE, TOKEN, screenshot_path, serve, wait_until


def _unavailable() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"no {CHROMIUM} (apt-get install chromium, as .ci/run does)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install -r requirements-dev.txt)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the browser tests must run in CI: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()


class Watched:
    """A page and what it did that a page of the dashboard must never do:
    open a dialog (an injected ``alert``), log a JavaScript error, or break
    its Content-Security-Policy."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on(
            "console",
            lambda message: message.type == "error" and self.errors.append(message.text),
        )

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def clean(self) -> None:
        assert self.dialogs == []
        assert self.errors == []
        assert self.page.locator("img").count() == 0


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        yield Watched(context.new_page())
    finally:
        context.close()


def expect(locator: Any) -> Any:
    """Playwright's ``expect`` (imported late: Playwright may be missing)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def log_in(watched: Watched, live: Live) -> None:
    page = watched.page
    page.goto(f"{live.url}/login?next=/dead?queue=victims")
    page.fill("input[name=token]", TOKEN)
    page.click("form.login button")
    page.wait_for_selector("text=Logged in: actions are enabled.")


PAGES = {
    "queues": "/",
    "jobs": "/jobs?queue=mail&state=completed",
    "job": "/jobs/{dead}?queue=mail",
    "dead": "/dead?queue=mail",
    "schedules": "/schedules",
    "workers": "/workers",
}


def test_every_page_loads_and_its_screenshot_is_written(live: Live, watched: Watched) -> None:
    wait_until(live.store.workers, "the worker to register")
    mail = live.store.queue("mail")
    wait_until(lambda: mail.throughput(window_s=3600), "the worker to report its throughput")
    log_in(watched, live)  # the pages as an operator sees them: with their actions
    page = watched.page
    for name, path in PAGES.items():
        page.goto(live.url + path.format(dead=live.hostile_dead_id))
        page.wait_for_selector("main#content h1")
        if name == "queues":
            page.wait_for_selector("svg.throughput rect")
        watched.clean()
        if (target := screenshot_path(name, live.engine)) is not None:
            page.screenshot(path=str(target), full_page=True)


def test_the_chart_draws_the_last_hour(live: Live, watched: Watched) -> None:
    mail = live.store.queue("mail")
    wait_until(
        lambda: sum(p.completed for p in mail.throughput(window_s=3600)) >= len(live.completed_ids),
        "the worker to report its throughput",
    )
    page = watched.page
    page.goto(live.url + "/")
    chart = page.locator('tr[data-queue="mail"] figure.chart')
    chart.locator("svg.throughput").wait_for()
    data = json.loads(chart.get_attribute("data-throughput"))
    bars = chart.locator("svg.throughput rect[data-kind]")
    minutes_with_counts = sum(
        1 for kind in ("completed", "retried", "dead") for n in data[kind] if n
    )
    assert bars.count() == minutes_with_counts > 0
    assert chart.locator('svg.throughput rect[data-kind="dead"]').count() >= 1
    watched.clean()


def test_the_page_refreshes_itself_without_reloading(live: Live, watched: Watched) -> None:
    page = watched.page
    page.goto(live.url + "/")
    page.evaluate("window.__not_reloaded = true")
    cell = page.locator('tr[data-queue="refreshed"] td[data-count="scheduled"]')
    assert cell.count() == 0
    queue = live.store.queue("refreshed")
    queue.enqueue({"n": 1}, delay=3600)
    expect(cell).to_have_text("1", timeout=10_000)
    queue.enqueue({"n": 2}, delay=3600)
    expect(cell).to_have_text("2", timeout=10_000)
    assert page.evaluate("window.__not_reloaded") is True
    assert "updated" in page.locator("#refresh-status").inner_text()
    watched.clean()


def test_the_hostile_payload_stays_text(live: Live, watched: Watched) -> None:
    page = watched.page
    page.goto(f"{live.url}/jobs/{live.hostile_scheduled_id}?queue=mail")
    shown = page.locator("#payload pre").inner_text()
    assert json.loads(shown) == HOSTILE
    assert shown == json.dumps(HOSTILE, indent=2, ensure_ascii=False)
    watched.clean()
    page.goto(f"{live.url}/jobs/{live.hostile_dead_id}?queue=mail")
    error = page.locator("#last-error").inner_text()
    assert f"RuntimeError: refused {HOSTILE['x']} {HOSTILE['y']}" in error
    watched.clean()
    for path in ("/dead?queue=mail", "/jobs?queue=mail&state=scheduled"):
        page.goto(live.url + path)
        assert HOSTILE["x"] in page.locator("main").inner_text()
        watched.clean()
    # Refreshed in place too.
    expect(page.locator("#refresh-status")).to_contain_text("updated", timeout=10_000)
    watched.clean()


def test_requeue_and_purge_in_the_browser(live: Live, watched: Watched) -> None:
    victims = live.store.queue("victims")
    first, _ = live.dead_victims(2)
    page = watched.page
    page.goto(f"{live.url}/dead?queue=victims")
    assert page.locator("form.action button").count() == 0  # not logged in: no action
    log_in(watched, live)
    page.goto(f"{live.url}/dead?queue=victims")
    page.locator(f'tr[data-job="{first}"] form.action button').click()
    page.wait_for_selector("text=1 dead job(s) requeued.")
    assert victims.get_job(first).state == "pending"  # type: ignore[union-attr]
    page.check("input[name=confirm]")
    page.locator("form.action.danger button").click()
    page.wait_for_selector("text=dead job(s) purged.")
    assert victims.stats().dead == 0
    watched.clean()


EVIL_PAGE = """<!doctype html><html><body><p>a page of another site</p>
<form id="f" method="post" action="{target}">
<input type="hidden" name="queue" value="victims"><input type="hidden" name="id" value="{victim}">
<input type="hidden" name="csrf" value="guess"></form>
<script>document.getElementById("f").submit()</script></body></html>"""


def test_a_cross_site_form_is_refused(live: Live, watched: Watched) -> None:
    """Another site's page posts a requeue form to the dashboard, in a
    browser logged in to it: refused (SameSite keeps the cookie home, and
    the Origin is another), and the dead job stays dead."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    (victim,) = live.dead_victims(1)
    log_in(watched, live)
    target = f"{live.url}/actions/requeue"
    evil = Starlette(
        routes=[Route("/", lambda _: HTMLResponse(EVIL_PAGE.format(target=target, victim=victim)))]
    )
    page = watched.page
    with serve(evil) as evil_url:
        with page.expect_navigation(url=target):
            page.goto(evil_url.replace("127.0.0.1", "localhost") + "/")
        assert "refused" in page.locator("#error").inner_text()
    assert live.store.queue("victims").get_job(victim).state == "dead"  # type: ignore[union-attr]


def test_pages_read_without_javascript(live: Live, browser: Any) -> None:
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(live.url + "/")
        assert page.locator('tr[data-queue="mail"] td[data-count="completed"]').inner_text() != ""
        assert page.locator("svg").count() == 0
        assert "the chart needs JavaScript" in page.locator('tr[data-queue="mail"]').inner_text()
        assert page.locator("#refresh-toggle").count() == 0
        page.goto(f"{live.url}/jobs/{live.hostile_scheduled_id}?queue=mail")
        assert json.loads(page.locator("#payload pre").inner_text()) == HOSTILE
        page.goto(f"{live.url}/jobs?queue=mail&state=completed")
        assert page.locator("tr[data-job]").count() == len(live.completed_ids)
        # The filter form works without script.
        page.select_option("select[name=state]", "dead")
        page.click("form.filters button")
        assert page.locator("tr[data-job]").count() == 1
        assert "state=dead" in page.url
    finally:
        context.close()
