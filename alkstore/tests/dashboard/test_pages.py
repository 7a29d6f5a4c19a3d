"""The dashboard over real HTTP (uvicorn on a thread), on both engines:
every page answers from the store's real state, every value is escaped,
and every action is refused without the token, the session's CSRF token
or from another site, and works with them."""

from __future__ import annotations

import base64
import html
import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest
from conftest import Live
from dashhelpers import HOSTILE, TOKEN, serve, wait_until

import alkstore
from alkstore.dashboard import create_app

PAGES = ["/", "/jobs?queue=mail&state=completed", "/dead?queue=mail", "/schedules", "/workers"]


@pytest.fixture
def client(live: Live) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=30) as made:
        yield made


def login(client: httpx.Client) -> str:
    """Log ``client`` in with the token; return the session's CSRF token."""
    response = client.post(
        "/login",
        data={"token": TOKEN, "next": "/dead"},
        headers={"origin": str(client.base_url).rstrip("/")},
    )
    assert response.status_code == 303, response.text
    page = client.get("/dead?queue=victims")
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, "a logged-in page carries the CSRF token"
    return found.group(1)


def post(
    client: httpx.Client, action: str, fields: dict[str, str], origin: str | None = "own"
) -> httpx.Response:
    headers = {}
    if origin == "own":
        headers["origin"] = str(client.base_url).rstrip("/")
    elif origin is not None:
        headers["origin"] = origin
    return client.post(f"/actions/{action}", data=fields, headers=headers)


@pytest.mark.parametrize("path", PAGES)
def test_pages_answer_with_security_headers(client: httpx.Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert response.headers["x-frame-options"] == "DENY"
    assert "<script>" not in response.text  # only <script src=...> of static/
    assert "<img" not in response.text


def test_overview_counts_every_state_and_the_hour(live: Live, client: httpx.Client) -> None:
    mail = live.store.queue("mail")
    wait_until(
        lambda: sum(p.completed for p in mail.throughput(window_s=3600)) >= len(live.completed_ids),
        "the worker to report its throughput",
    )
    page = client.get("/").text
    row = page[page.index('data-queue="mail"') :]
    row = row[: row.index("</tr>")]
    stats = live.store.queue("mail").stats()
    for state, count in [
        ("scheduled", stats.scheduled),
        ("completed", live.store.queue("mail").completed_count()),
        ("dead", 1),
    ]:
        assert re.search(rf'data-count="{state}"><a [^>]+>{count}</a>', row), state
    data = re.search(r'data-throughput="([^"]+)"', row)
    assert data
    series = json.loads(html.unescape(data.group(1)))
    assert len(series["completed"]) == 60
    assert sum(series["completed"]) >= len(live.completed_ids)
    assert sum(series["dead"]) == 1


def test_jobs_lists_by_state_and_pages_by_id(live: Live, client: httpx.Client) -> None:
    page = client.get("/jobs", params={"queue": "mail", "state": "completed"}).text
    listed = [int(i) for i in re.findall(r'<tr data-job="(\d+)">', page)]
    assert listed == sorted(live.completed_ids)
    after = client.get(
        "/jobs", params={"queue": "mail", "state": "completed", "after": live.completed_ids[5]}
    ).text
    assert [int(i) for i in re.findall(r'<tr data-job="(\d+)">', after)] == live.completed_ids[6:]
    scheduled = client.get("/jobs", params={"queue": "mail", "state": "scheduled"}).text
    assert f'data-job="{live.hostile_scheduled_id}"' in scheduled
    assert client.get("/jobs", params={"state": "nope"}).status_code == 400
    assert client.get("/jobs", params={"queue": "bad name"}).status_code == 400


def test_the_hostile_payload_is_text_everywhere(live: Live, client: httpx.Client) -> None:
    pages = [
        client.get(f"/jobs/{live.hostile_scheduled_id}?queue=mail").text,
        client.get(f"/jobs/{live.hostile_dead_id}?queue=mail").text,
        client.get("/dead", params={"queue": "mail"}).text,
        client.get("/jobs", params={"queue": "mail", "state": "scheduled"}).text,
        client.get("/jobs", params={"queue": "mail", "state": "completed"}).text,
    ]
    schedules = client.get("/schedules").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in schedules
    assert "<script>alert" not in schedules
    assert all("&lt;script&gt;alert(1)&lt;/script&gt;" in page for page in pages[:4])
    for page in pages:
        assert "<script>alert" not in page
        assert "<img" not in page
        assert "&lt;img src=x onerror=alert(2)&gt;" in page
    job_page = pages[0]
    shown = re.search(r'<div id="payload"><pre class="value">(.*?)</pre>', job_page, re.S)
    assert shown
    assert json.loads(html.unescape(shown.group(1))) == HOSTILE
    error = re.search(r'<pre class="value error" id="last-error">(.*?)</pre>', pages[1], re.S)
    assert error
    assert f"RuntimeError: refused {HOSTILE['x']} {HOSTILE['y']}" in html.unescape(error.group(1))


def test_a_completed_job_shows_its_result(live: Live, client: httpx.Client) -> None:
    page = client.get(f"/jobs/{live.completed_ids[0]}?queue=mail").text
    result = re.search(r'<div id="result"><pre class="value">(.*?)</pre>', page, re.S)
    assert result
    assert json.loads(html.unescape(result.group(1))) == {"sent_to": "user0@example.com"}
    assert client.get("/jobs/999999999?queue=mail").status_code == 404


def test_find_redirects_to_the_job(live: Live, client: httpx.Client) -> None:
    response = client.get("/find", params={"id": live.hostile_dead_id})
    assert response.status_code == 303
    assert response.headers["location"] == f"/jobs/{live.hostile_dead_id}?queue=mail"


def test_schedules_show_the_next_boundary(live: Live, client: httpx.Client) -> None:
    (schedule,) = live.store.schedules()
    page = client.get("/schedules").text
    assert 'data-schedule="nightly-report"' in page
    assert schedule.next_run_at.strftime("%Y-%m-%d %H:%M:%SZ") in page


def test_workers_show_what_runs(live: Live, client: httpx.Client) -> None:
    gate = live.gates.setdefault("workers-page", threading.Event())
    job_id = live.app.tasks["hold"].enqueue("workers-page")
    try:
        (worker,) = wait_until(
            lambda: [w for w in live.store.workers() if job_id in w.running],
            "the worker to report the job it runs",
        )
        page = client.get("/workers").text
        row = page[page.index(f'data-worker="{html.escape(worker.id)}"') :]
        row = row[: row.index("</tr>")]
        assert f'href="/find?id={job_id}">{job_id}</a>' in row
        assert ">mail</a>" in row
    finally:
        gate.set()
    mail = live.store.queue("mail")
    wait_until(lambda: mail.get_job(job_id).state == "completed", "the held job to finish")  # type: ignore[union-attr]


def test_read_only_refuses_every_action(live: Live) -> None:
    (victim,) = live.dead_victims(1)
    with httpx.Client(base_url=live.readonly_url) as client:
        assert "read-only" in client.get("/").text
        assert client.get("/login").status_code == 404
        own = {"origin": live.readonly_url}
        assert client.post("/login", data={"token": TOKEN}, headers=own).status_code == 403
        for action in ("requeue", "purge"):
            response = client.post(
                f"/actions/{action}",
                data={"queue": "victims", "id": str(victim), "confirm": "on"},
                headers=own,
            )
            assert response.status_code == 403
    assert live.store.queue("victims").get_job(victim).state == "dead"  # type: ignore[union-attr]


def test_actions_are_refused_without_the_token_or_csrf_or_from_another_site(
    live: Live, client: httpx.Client
) -> None:
    (victim,) = live.dead_victims(1)
    fields = {"queue": "victims", "id": str(victim)}
    # No session.
    assert post(client, "requeue", fields).status_code == 403
    # A wrong token logs nobody in.
    wrong = client.post("/login", data={"token": TOKEN + "x"}, headers={"origin": live.url})
    assert wrong.status_code == 403
    assert "alkstore_dashboard" not in wrong.cookies
    # A forged cookie is no session.
    client.cookies.set("alkstore_dashboard", "e30.AAAA")
    assert post(client, "requeue", {**fields, "csrf": "AAAA"}).status_code == 403
    client.cookies.clear()
    csrf = login(client)
    # Logged in, but no CSRF token, a wrong one, another site, or no origin at all.
    assert post(client, "requeue", fields).status_code == 403
    assert post(client, "requeue", {**fields, "csrf": csrf + "x"}).status_code == 403
    assert (
        post(client, "requeue", {**fields, "csrf": csrf}, origin="http://evil.example").status_code
        == 403
    )
    assert post(client, "requeue", {**fields, "csrf": csrf}, origin=None).status_code == 403
    assert (
        post(
            client, "purge", {"queue": "victims", "confirm": "on", "csrf": csrf}, origin="null"
        ).status_code
        == 403
    )
    # GET does nothing.
    assert client.get("/actions/requeue", params={**fields, "csrf": csrf}).status_code == 405
    assert live.store.queue("victims").get_job(victim).state == "dead"  # type: ignore[union-attr]
    assert live.store.queue("victims").stats().dead >= 1


def test_requeue_and_purge_work_with_the_token(live: Live, client: httpx.Client) -> None:
    victims = live.store.queue("victims")
    first, second, third = live.dead_victims(3)
    csrf = login(client)
    response = post(
        client,
        "requeue",
        {"queue": "victims", "id": str(first), "csrf": csrf, "next": "/dead?queue=victims"},
    )
    assert response.status_code == 303
    assert response.headers["location"] == "/dead?queue=victims&done=requeued&n=1"
    assert victims.get_job(first).state == "pending"  # type: ignore[union-attr]
    assert "1 dead job(s) requeued." in client.get(response.headers["location"]).text
    # A next outside the dashboard goes to the overview instead.
    response = post(
        client,
        "requeue",
        {"queue": "victims", "id": str(second), "csrf": csrf, "next": "//evil.example/"},
    )
    assert response.headers["location"].startswith("/?done=requeued")
    assert victims.get_job(second).state == "pending"  # type: ignore[union-attr]
    # A purge needs its confirmation.
    assert post(client, "purge", {"queue": "victims", "csrf": csrf}).status_code == 400
    assert victims.get_job(third).state == "dead"  # type: ignore[union-attr]
    response = post(client, "purge", {"queue": "victims", "csrf": csrf, "confirm": "on"})
    assert response.status_code == 303
    assert victims.stats().dead == 0
    assert victims.get_job(third) is None
    # Logging out ends the session.
    assert (
        client.post("/logout", data={"csrf": csrf}, headers={"origin": live.url}).status_code == 303
    )
    (victim,) = live.dead_victims(1)
    assert (
        post(client, "requeue", {"queue": "victims", "id": str(victim), "csrf": csrf}).status_code
        == 403
    )


def test_behind_a_proxy_links_carry_the_root_path(live: Live) -> None:
    """uvicorn's root_path: the proxy strips /alkstore, every link keeps it."""
    with serve(create_app(live.store, refresh_s=0), root_path="/alkstore") as url:
        page = httpx.get(url + "/dead?queue=mail").text
        assert 'href="/alkstore/static/dashboard.css"' in page
        assert f'href="/alkstore/jobs/{live.hostile_dead_id}?queue=mail"' in page
        links = re.findall(r'href="(/[^"]*)"', page)
        assert links
        assert all(link.startswith("/alkstore/") for link in links)
        assert httpx.get(urljoin(url, "/static/dashboard.js")).status_code == 200


def test_the_command_refuses_actions_without_a_token(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "alkstore", "dashboard", "--actions", "--url", "sqlite:///x.db"],
        capture_output=True,
        text=True,
        env={"PATH": "", "ALKSTORE_DASHBOARD_TOKEN": ""},
        cwd=str(tmp_path),
        check=False,
    )
    assert done.returncode == 1
    assert "--actions needs a token" in done.stderr


def test_the_command_serves_the_store(tmp_path: Path) -> None:
    """``alkstore dashboard`` end to end: it serves the store of --url."""
    url = f"sqlite:///{tmp_path / 'cmd.db'}"
    with alkstore.open(url) as store:
        store.queue("reports").enqueue({"n": 1})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "alkstore", "dashboard", "--url", url, "--port", str(port)]
    process = subprocess.Popen([*command, "--log-level", "WARNING"], stderr=subprocess.DEVNULL)
    try:

        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, "the command's server")
        assert 'data-queue="reports"' in httpx.get(f"http://127.0.0.1:{port}/").text
        # On a loopback --host it answers only loopback names (DNS rebinding).
        assert httpx.get(f"http://localhost:{port}/").status_code == 200
        rebound = httpx.get(f"http://127.0.0.1:{port}/", headers={"host": "evil.example"})
        assert rebound.status_code == 400
    finally:
        process.terminate()
        process.wait(30)


def test_metrics_serve_the_queues_gauges(live: Live) -> None:
    pytest.importorskip("prometheus_client")
    with serve(create_app(live.store, refresh_s=0, metrics=True)) as url:
        response = httpx.get(url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    dead = live.store.queue("mail").stats().dead
    assert f'alkstore_queue_jobs{{queue="mail",state="dead"}} {float(dead)}' in response.text
    with httpx.Client(base_url=live.readonly_url) as client:
        assert client.get("/metrics").status_code == 404  # only when asked for


def test_a_binary_payload_shows_as_hex_and_base64(live: Live, client: httpx.Client) -> None:
    data = b"\x00\x01<img src=x>\xff" * 3
    job_id = live.store.queue("binary").enqueue(data, delay=3600)
    page = client.get(f"/jobs/{job_id}?queue=binary").text
    assert f"<p>{len(data)} bytes (hex, then base64):</p>" in page
    assert data[:16].hex(" ") in page
    assert base64.b64encode(data).decode() in page
    assert "<img" not in page
    listed = client.get("/jobs", params={"queue": "binary", "state": "scheduled"}).text
    assert f"{len(data)} bytes: {data[:16].hex(' ')}" in listed


def test_a_lapsed_claim_is_marked_on_the_overview_and_the_list(
    live: Live, client: httpx.Client
) -> None:
    """A claim past its deadline (its worker died) shows as lapsed, with
    its worker and deadline, not as one more processing job."""
    long_ago = datetime(2024, 1, 1, tzinfo=UTC)
    with alkstore.open(live.store_url, **live.store_options, clock=lambda: long_ago) as then:
        stalled = then.queue("stalled")
        job_id = stalled.enqueue({"n": 1})
        handle = stalled.claim_one("dead-worker")
        assert handle is not None
        assert handle.id == job_id
    with serve(create_app(live.store, refresh_s=0)) as url:
        overview = httpx.get(url + "/").text
        row = overview[overview.index('data-queue="stalled"') :]
        row = row[: row.index("</tr>")]
        assert '<span class="badge lapsed" data-count="lapsed"' in row
        assert ">1 lapsed</span>" in row
        listing = httpx.get(url + "/jobs?queue=stalled&state=processing").text
        assert '<span class="badge lapsed">lapsed</span>' in listing
        assert "<td>dead-worker</td>" in listing
        assert 'datetime="2024-01-01T00:00:30+00:00"' in listing  # the claim deadline


def test_queues_given_to_the_dashboard_show_while_empty(live: Live) -> None:
    """An app's queues stay on the overview and /metrics when they drain."""
    pytest.importorskip("prometheus_client")
    app = create_app(live.store, refresh_s=0, metrics=True, queues=["idle-queue"])
    with serve(app) as url:
        overview = httpx.get(url + "/").text
        metrics = httpx.get(url + "/metrics").text
    assert 'data-queue="idle-queue"' in overview
    assert 'alkstore_queue_jobs{queue="idle-queue",state="pending"} 0.0' in metrics
    assert 'alkstore_queue_paused{queue="idle-queue"} 0.0' in metrics
    with httpx.Client(base_url=live.readonly_url) as client:
        assert 'data-queue="idle-queue"' not in client.get("/").text


def test_cancel_from_a_job_page_leads_to_its_queue_not_a_missing_job(
    live: Live, client: httpx.Client
) -> None:
    job_id = live.store.queue("later").enqueue({"n": 1}, delay=3600)
    csrf = login(client)
    page = client.get(f"/jobs/{job_id}?queue=later").text
    found = re.search(r'action="/actions/cancel".*?name="next" value="([^"]+)"', page, re.S)
    assert found, "the job page has a cancel form"
    next_page = html.unescape(found.group(1))
    assert next_page == "/jobs?queue=later&state=scheduled"
    response = post(
        client, "cancel", {"queue": "later", "id": str(job_id), "csrf": csrf, "next": next_page}
    )
    assert response.status_code == 303
    landed = client.get(response.headers["location"])
    assert landed.status_code == 200
    assert "1 job(s) cancelled." in landed.text
    assert live.store.queue("later").get_job(job_id) is None


@pytest.mark.parametrize(
    "path",
    [
        "/jobs?queue=mail&after=%C2%B2",
        "/dead?queue=mail&after=%D9%A1",
        "/find?id=%C2%B2",
        "/?done=requeued&n=%C2%B2",
        "/jobs?queue=mail&after=" + "9" * 5000,
    ],
)
def test_odd_digits_are_refused_or_ignored_never_a_bare_500(
    client: httpx.Client, path: str
) -> None:
    """``str.isdigit`` takes '²' and other scripts' digits; ``int`` does not."""
    response = client.get(path)
    assert response.status_code in (200, 400)
    assert "content-security-policy" in response.headers
    if path.startswith("/?done"):
        assert "0 dead job(s) requeued." in response.text


def test_a_foreign_cookie_is_no_session_not_an_error(live: Live) -> None:
    cookie = "alkstore_dashboard=abc.\u00e9".encode()  # UTF-8 bytes, as a browser sends
    response = httpx.get(live.url + "/", headers={"cookie": cookie})
    assert response.status_code == 200
    assert "Log in" in response.text


def test_a_host_not_allowed_gets_400_with_the_headers(live: Live) -> None:
    app = create_app(live.store, refresh_s=0, allowed_hosts=["127.0.0.1", "localhost"])
    with serve(app) as url:
        assert httpx.get(url + "/").status_code == 200
        rebound = httpx.get(url + "/", headers={"host": "evil.example"})
    assert rebound.status_code == 400
    assert "mail" not in rebound.text
    assert "content-security-policy" in rebound.headers


def test_a_bug_answers_500_with_the_headers(live: Live) -> None:
    class Broken:
        """A store whose queue listing fails with an error no handler knows."""

        def __getattr__(self, name: str) -> object:
            return getattr(live.store, name)

        def queue_names(self) -> list[str]:
            raise ZeroDivisionError("a bug")

    with serve(create_app(Broken(), refresh_s=0)) as url:  # type: ignore[arg-type]
        response = httpx.get(url + "/")
    assert response.status_code == 500
    assert "the dashboard failed: ZeroDivisionError" in response.text
    assert "content-security-policy" in response.headers


def test_big_payloads_are_shown_cut(live: Live, client: httpx.Client) -> None:
    queue = live.store.queue("big")
    blob = bytes(range(256)) * 4096  # 1 MiB
    text = "x" * 600_000
    blob_id = queue.enqueue(blob, delay=3600)
    text_id = queue.enqueue({"text": text}, delay=3600)
    blob_page = client.get(f"/jobs/{blob_id}?queue=big").text
    text_page = client.get(f"/jobs/{text_id}?queue=big").text
    assert f"\u2026 {len(blob) - 256 * 1024} more bytes" in blob_page
    assert len(blob_page) < 600_000
    assert "more characters" in text_page
    assert len(text_page) < 400_000
    listing = client.get("/jobs?queue=big&state=scheduled").text
    assert f"{len(blob)} bytes:" in listing
    assert len(listing) < 100_000


@pytest.mark.parametrize("name", [".", ".."])
def test_queues_named_dot_and_dot_dot_have_reachable_job_pages(
    live: Live, client: httpx.Client, name: str
) -> None:
    job_id = live.store.queue(name).enqueue({"n": 1}, delay=3600)
    listing = client.get("/jobs", params={"queue": name, "state": "scheduled"}).text
    link = html.unescape(re.search(rf'href="([^"]*/jobs/{job_id}\?[^"]*)"', listing).group(1))  # type: ignore[union-attr]
    page = client.get(link)
    assert page.status_code == 200
    assert f"Job {job_id}" in page.text
