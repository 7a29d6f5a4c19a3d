"""The dashboard's Starlette app: its pages, its actions and their guards
(docs/operations.md "The dashboard").

Pages are rendered on the server from the store's public API and read
without JavaScript; ``static/dashboard.js`` only refreshes the page's main
content in place and draws the throughput charts from the data the page
carries. Every value goes through Jinja2's autoescape.

The store's calls are blocking: the page endpoints are plain functions,
which Starlette runs on its thread pool.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, cast
from urllib.parse import parse_qs, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import alkstore
from alkstore.contract.job import Job, ListedState
from alkstore.contract.queue import Queue
from alkstore.contract.store import Store
from alkstore.dashboard import present
from alkstore.dashboard.counts import QueueCounts
from alkstore.dashboard.security import (
    MIN_TOKEN_LENGTH,
    SecurityHeaders,
    Session,
    Sessions,
    add_headers,
    cross_site,
)
from alkstore.errors import AlkstoreError, ValidationError
from alkstore.logic import validation as v

__all__ = ["STATES", "create_app"]

HERE = Path(__file__).resolve().parent
#: The states the jobs page filters by (``queue.jobs(state)``).
STATES = ("pending", "scheduled", "processing", "completed", "dead")
#: Rows a page lists.
PAGE_SIZE = 50
#: The largest form body an action reads, bytes.
MAX_FORM_BYTES = 16_384
#: What an action's redirect says, by its ``done`` code (never free text
#: from the URL, so a link cannot make the page say anything else).
NOTICES = {
    "requeued": "{n} dead job(s) requeued.",
    "purged": "{n} dead job(s) purged.",
    "cancelled": "{n} job(s) cancelled.",
    "run_now": "{n} job(s) made due now.",
    "paused": "Queue paused.",
    "resumed": "Queue resumed.",
    "login": "Logged in: actions are enabled.",
    "logout": "Logged out.",
}


def _decimal(text: str, max_digits: int) -> bool:
    """Whether ``text`` is 1 to ``max_digits`` ASCII digits (``str.isdigit``
    also takes ``²`` and other scripts' digits, which ``int`` refuses or
    reads otherwise)."""
    return 0 < len(text) <= max_digits and text.isascii() and text.isdigit()


@dataclass(frozen=True)
class QueueRow:
    """One queue on the overview."""

    name: str
    pending: int
    scheduled: int
    processing: int
    lapsed: int
    dead: int
    completed: int
    counted_at: datetime
    paused: bool
    throughput: present.Throughput


class Dashboard:
    """The pages and actions over one store."""

    def __init__(
        self,
        store: Store,
        *,
        actions: bool,
        token: str | None,
        refresh_s: float,
        queues: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.named = tuple(queues)
        self.actions = actions
        self.sessions = Sessions(token) if token is not None else None
        self.refresh_s = refresh_s
        # Recounted at most once per refresh (or every 5 s when pages do not
        # refresh themselves): counting a big queue is the costly read.
        self.counts = QueueCounts(store, max_age_s=refresh_s or 5.0)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            when=present.when, iso=present.iso, first_line=present.first_line, span=present.span
        )
        self.env.globals.update(
            preview=present.preview,
            relative=present.relative,
            state_of=present.state_of,
            one_line_json=present.one_line_json,
        )

    # -- rendering -------------------------------------------------------------

    def href(
        self, request: Request, name: str, query: dict[str, Any] | None = None, **params: Any
    ) -> str:
        """A path-only link (the proxy's path prefix included)."""
        path = str(request.app.url_path_for(name, **params))
        root = str(request.scope.get("root_path", "")).rstrip("/")
        pairs = {k: v for k, v in (query or {}).items() if v is not None and v != ""}
        return f"{root}{path}" + (f"?{urlencode(pairs)}" if pairs else "")

    def session(self, request: Request) -> Session | None:
        if not self.actions or self.sessions is None:
            return None
        return self.sessions.read(request)

    def render(self, request: Request, template: str, *, status: int = 200, **ctx: Any) -> Response:
        session = self.session(request)
        notice = ""
        done = request.query_params.get("done")
        if done in NOTICES:
            count = request.query_params.get("n", "0")
            notice = NOTICES[done].format(n=int(count) if _decimal(count, 19) else 0)
        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        html = self.env.get_template(template).render(
            href=lambda name, query=None, **params: self.href(request, name, query, **params),
            static=lambda path: self.href(request, "static", path=path),
            actions=self.actions,
            can_act=session is not None,
            csrf=session.csrf if session else "",
            refresh_s=self.refresh_s,
            engine=type(self.store).__name__,
            version=alkstore.__version__,
            here=here,
            notice=notice,
            now=self.now(),
            **ctx,
        )
        return HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})

    def error(self, request: Request, status: int, message: str) -> Response:
        return self.render(
            request, "error.html", status=status, title="Error", page="", message=message
        )

    # -- reading ---------------------------------------------------------------

    def now(self) -> datetime:
        """Now by the store's clock (PostgreSQL's: the server's), against
        which the store's instants are shown; the host's when the store
        cannot say (an error page about the store)."""
        try:
            return self.store._now()
        except AlkstoreError:
            return datetime.now(UTC)

    def queue_names(self) -> list[str]:
        """The store's queues with the ones the dashboard was given, sorted."""
        return sorted({*self.store.queue_names(), *self.named})

    def queue_of(self, name: str | None) -> Queue:
        if not name:
            raise HTTPException(400, "name a queue")
        try:
            return self.store.queue(name)
        except ValidationError as exc:
            raise HTTPException(400, str(exc)) from None

    @staticmethod
    def after_of(request: Request) -> int | None:
        after = request.query_params.get("after")
        if not after:
            return None
        if not _decimal(after, 19) or int(after) >= 2**63:
            raise HTTPException(400, "after must be a job id")
        return int(after)

    def overview(self, request: Request) -> Response:
        now = self.now()
        rows = []
        for name in self.queue_names():
            queue = self.store.queue(name)
            counted = self.counts.get(name)
            stats = counted.stats
            rows.append(
                QueueRow(
                    name=name,
                    pending=stats.pending,
                    scheduled=stats.scheduled,
                    processing=stats.processing,
                    lapsed=counted.lapsed,
                    dead=stats.dead,
                    completed=counted.completed,
                    counted_at=counted.at,
                    paused=queue.is_paused(),
                    throughput=present.throughput(queue.throughput(window_s=3600), now),
                )
            )
        return self.render(request, "overview.html", title="Queues", page="overview", queues=rows)

    def jobs(self, request: Request) -> Response:
        names = self.queue_names()
        name = request.query_params.get("queue") or (names[0] if names else "")
        state = request.query_params.get("state") or "pending"
        if state not in STATES:
            raise HTTPException(400, f"state must be one of {', '.join(STATES)}")
        after = self.after_of(request)
        found: list[Job] = []
        if name:
            listed = cast(ListedState, state)
            found = self.queue_of(name).jobs(listed, limit=PAGE_SIZE, after_id=after)
        return self.render(
            request,
            "jobs.html",
            title=f"{state} jobs of {name}" if name else "Jobs",
            page="jobs",
            names=names,
            queue=name,
            state=state,
            states=STATES,
            jobs=found,
            after=after,
            more=len(found) == PAGE_SIZE,
        )

    def job(self, request: Request) -> Response:
        name = request.query_params.get("queue", "")
        job_id = request.path_params["job_id"]
        found = self.queue_of(name).get_job(v.job_id(job_id))
        if found is None:
            return self.error(request, 404, f"queue {name} has no job {job_id}")
        return self.render(
            request,
            "job.html",
            title=f"Job {found.id}",
            page="jobs",
            job=found,
            payload=present.show_payload(found),
            result=present.show_result(found),
        )

    def find(self, request: Request) -> Response:
        given = request.query_params.get("id", "").strip()
        if not _decimal(given, 19) or int(given) >= 2**63:
            return self.error(request, 400, "a job id is a whole number")
        job_id = int(given)
        names = request.query_params.getlist("queue") or self.queue_names()
        for name in names:
            if self.queue_of(name).get_job(job_id) is not None:
                return RedirectResponse(
                    self.href(request, "job", {"queue": name}, job_id=job_id), 303
                )
        return self.error(request, 404, f"no job {job_id} in any queue")

    def dead(self, request: Request) -> Response:
        names = self.queue_names()
        counts = {name: self.counts.get(name).stats.dead for name in names}
        default = next((n for n, c in counts.items() if c), names[0] if names else "")
        name = request.query_params.get("queue") or default
        after = self.after_of(request)
        found = self.queue_of(name).dead_jobs(PAGE_SIZE, after) if name else []
        return self.render(
            request,
            "dead.html",
            title=f"Dead letters of {name}" if name else "Dead letters",
            page="dead",
            counts=counts,
            queue=name,
            jobs=found,
            after=after,
            more=len(found) == PAGE_SIZE,
        )

    def schedules(self, request: Request) -> Response:
        return self.render(
            request,
            "schedules.html",
            title="Schedules",
            page="schedules",
            schedules=self.store.schedules(),
            unreadable=self.store.unreadable_schedules(),
        )

    def workers(self, request: Request) -> Response:
        return self.render(
            request, "workers.html", title="Workers", page="workers", workers=self.store.workers()
        )

    # -- login -----------------------------------------------------------------

    def login_page(self, request: Request) -> Response:
        if not self.actions:
            return self.error(request, 404, "actions are disabled: the dashboard is read-only")
        return self.render(
            request,
            "login.html",
            title="Log in",
            page="login",
            wrong=False,
            next=self.next_of(request, request.query_params.get("next")),
        )

    async def login(self, request: Request) -> Response:
        if not self.actions or self.sessions is None:
            return self.error(request, 403, "actions are disabled: the dashboard is read-only")
        if why := cross_site(request):
            return self.error(request, 403, f"refused: {why}")
        form = await self.form(request)
        token = form.get("token", "")
        if not self.sessions.token_matches(token):
            return self.render(
                request,
                "login.html",
                status=403,
                title="Log in",
                page="login",
                wrong=True,
                next=self.next_of(request, form.get("next")),
            )
        value, _ = self.sessions.new_cookie()
        response = RedirectResponse(
            self.with_notice(self.next_of(request, form.get("next")), "login", 1), 303
        )
        self.sessions.set_cookie(response, request, value)
        return response

    async def logout(self, request: Request) -> Response:
        refused = await self.refused(request)
        if isinstance(refused, Response):
            return refused
        response = RedirectResponse(
            self.with_notice(self.href(request, "overview"), "logout", 1), 303
        )
        Sessions.clear_cookie(response, request)
        return response

    # -- actions ---------------------------------------------------------------

    @staticmethod
    async def form(request: Request) -> dict[str, str]:
        """The urlencoded form of a POST (each field's first value)."""
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        if kind != "application/x-www-form-urlencoded":
            raise HTTPException(415, "send an application/x-www-form-urlencoded form")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                raise HTTPException(413, "the form is too large")
        parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        return {key: values[0] for key, values in parsed.items()}

    async def refused(self, request: Request) -> Response | dict[str, str]:
        """The form of an allowed action, else the 403 response saying why.

        Allowed: actions enabled, a POST from the dashboard's own origin,
        a live session (a login with the token), and the session's CSRF
        token in the form."""
        if not self.actions or self.sessions is None:
            return self.error(request, 403, "actions are disabled: the dashboard is read-only")
        if why := cross_site(request):
            return self.error(request, 403, f"refused: {why}")
        session = self.sessions.read(request)
        if session is None:
            return self.error(request, 403, "refused: log in with the dashboard's token first")
        form = await self.form(request)
        if not Sessions.csrf_matches(session, form.get("csrf")):
            return self.error(
                request, 403, "refused: the form's CSRF token is missing or wrong (reload the page)"
            )
        return form

    def next_of(self, request: Request, given: str | None) -> str:
        """Where to go after an action: a path of this dashboard, else its overview."""
        root = str(request.scope.get("root_path", "")).rstrip("/")
        if (
            given
            and given.startswith(f"{root}/")
            and not given.startswith("//")
            and "\\" not in given
        ):
            return given
        return self.href(request, "overview")

    @staticmethod
    def with_notice(path: str, done: str, n: int) -> str:
        base, _, query = path.partition("?")
        pairs = [
            (k, val)
            for k, vals in parse_qs(query).items()
            for val in vals
            if k not in ("done", "n")
        ]
        pairs += [("done", done), ("n", str(n))]
        return f"{base}?{urlencode(pairs)}"

    async def act(self, request: Request) -> Response:
        form = await self.refused(request)
        if isinstance(form, Response):
            return form
        action = request.path_params["action"]
        run = self.ACTIONS.get(action)
        if run is None:
            return self.error(request, 404, f"no action {action!r}")
        queue = self.queue_of(form.get("queue"))
        try:
            done, n = await run_in_threadpool(run, queue, form)
        except ValidationError as exc:
            return self.error(request, 400, str(exc))
        finally:
            self.counts.forget(queue.name)  # the next page shows the action's effect
        return RedirectResponse(
            self.with_notice(self.next_of(request, form.get("next")), done, n), 303
        )

    @staticmethod
    def _id(form: dict[str, str]) -> int:
        given = form.get("id", "")
        if not _decimal(given, 19):
            raise ValidationError("a job id is a whole number")
        return v.job_id(int(given))

    @staticmethod
    def _every_dead_id(queue: Queue) -> Iterator[int]:
        after: int | None = None
        while page := queue.dead_jobs(1000, after):
            yield from (found.id for found in page)
            after = page[-1].id

    @classmethod
    def _requeue(cls, queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        if form.get("all") == "1":
            return "requeued", sum(queue.requeue(i) for i in list(cls._every_dead_id(queue)))
        return "requeued", int(queue.requeue(cls._id(form)))

    @staticmethod
    def _purge(queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        if form.get("confirm") != "on":
            raise ValidationError("tick the box to confirm the purge")
        older = form.get("older_than", "").strip()
        if not older:
            return "purged", queue.purge_dead()
        try:
            seconds = float(older)
        except ValueError:
            raise ValidationError("older than: a number of seconds") from None
        if not math.isfinite(seconds):
            raise ValidationError("older than: a number of seconds")
        return "purged", queue.purge_dead(seconds)

    @classmethod
    def _cancel(cls, queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        return "cancelled", int(queue.cancel(cls._id(form)))

    @classmethod
    def _run_now(cls, queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        return "run_now", int(queue.run_now(cls._id(form)))

    @staticmethod
    def _pause(queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        return "paused", int(queue.pause())

    @staticmethod
    def _resume(queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        return "resumed", int(queue.resume())

    ACTIONS: ClassVar[dict[str, Callable[[Queue, dict[str, str]], tuple[str, int]]]] = {}


Dashboard.ACTIONS.update(
    {
        "requeue": Dashboard._requeue,
        "purge": Dashboard._purge,
        "cancel": Dashboard._cancel,
        "run-now": Dashboard._run_now,
        "pause": Dashboard._pause,
        "resume": Dashboard._resume,
    }
)


def create_app(
    store: Store,
    *,
    actions: bool = False,
    token: str | None = None,
    refresh_s: float = 5.0,
    metrics: bool = False,
    queues: Sequence[str] = (),
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard over ``store`` as an ASGI app (serve it with uvicorn).

    Parameters
    ----------
    store
        An open store; the caller keeps it and closes it.
    actions
        Enable requeue, purge, cancel, run now, pause and resume; each then
        needs a login with ``token`` and a same-origin form.
    token
        The secret a browser logs in with, at least
        :data:`~alkstore.dashboard.security.MIN_TOKEN_LENGTH` characters;
        required with ``actions``.
    refresh_s
        How often the pages refresh themselves, seconds; ``0`` never.
    metrics
        Also serve ``GET /metrics``: the store's per-queue gauges of
        :class:`alkstore.contrib.prometheus.StoreCollector`, read at each
        scrape, for Prometheus (needs the ``prometheus`` extra).
    queues
        Queues to show (and measure) even while they hold no job, beside
        those the store has (``Store.queue_names()``): an app's, say.
    allowed_hosts
        The ``Host`` names the dashboard answers (Starlette's
        ``TrustedHostMiddleware``; ``*.example.com`` patterns allowed);
        others get 400, so a page on another domain that resolves to this
        address (DNS rebinding) cannot read it. ``None``: any host.

    Raises
    ------
    ValueError
        For actions without a usable token.
    ImportError
        For ``metrics`` without ``prometheus_client``.
    """
    if actions and (token is None or len(token) < MIN_TOKEN_LENGTH):
        raise ValueError(
            f"actions need a token of at least {MIN_TOKEN_LENGTH} characters "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe())')"
        )
    if not (refresh_s == 0 or 0.1 <= refresh_s <= 3600):
        raise ValueError("refresh_s must be 0 (never) or 0.1 to 3600 seconds")
    queues = [v.queue_name(name) for name in queues]
    dash = Dashboard(
        store,
        actions=actions,
        token=token if actions else None,
        refresh_s=refresh_s,
        queues=queues,
    )

    def on_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            return dash.error(request, exc.status_code, exc.detail)
        if isinstance(exc, ValidationError):
            return dash.error(request, 400, str(exc))
        return dash.error(request, 503, f"the store failed: {type(exc).__name__}: {exc}")

    def on_bug(request: Request, exc: Exception) -> Response:
        # Starlette calls this outside the middleware (after logging the
        # traceback), so the page gets the security headers here.
        try:
            response = dash.error(request, 500, f"the dashboard failed: {type(exc).__name__}")
        except Exception:
            response = PlainTextResponse("the dashboard failed", status_code=500)
        add_headers(response)
        return response

    routes = [
        Route("/", dash.overview, name="overview"),
        Route("/jobs", dash.jobs, name="jobs"),
        # The queue in the query, not the path: "." and ".." are queue names
        # that a browser would fold out of a path.
        Route("/jobs/{job_id:int}", dash.job, name="job"),
        Route("/find", dash.find, name="find"),
        Route("/dead", dash.dead, name="dead"),
        Route("/schedules", dash.schedules, name="schedules"),
        Route("/workers", dash.workers, name="workers"),
        Route("/login", dash.login_page, methods=["GET"], name="login"),
        Route("/login", dash.login, methods=["POST"], name="login_post"),
        Route("/logout", dash.logout, methods=["POST"], name="logout"),
        Route("/actions/{action}", dash.act, methods=["POST"], name="action"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    if metrics:
        routes.append(Route("/metrics", _metrics_endpoint(store, queues), name="metrics"))
    middleware = [Middleware(SecurityHeaders)]
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: on_error, AlkstoreError: on_error, Exception: on_bug},
    )


def _metrics_endpoint(store: Store, queues: Sequence[str]) -> Callable[[Request], Response]:
    """``GET /metrics``: a registry of the store's gauges, in Prometheus's
    text format (prometheus_client imported only when asked for)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    from alkstore.contrib.prometheus import StoreCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, always=queues))

    def endpoint(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return endpoint
