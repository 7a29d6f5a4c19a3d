"""What guards the dashboard's actions (docs/operations.md "The dashboard"):
the signed session cookie a login with the token sets, the CSRF token each
form carries, the same-origin check of every POST, and the response headers
(a Content-Security-Policy with no inline script) on everything served.

A session cookie is ``base64url(json) "." base64url(HMAC-SHA256)``, keyed by
a key derived from the token: it names no secret, cannot be forged without
the token, ends after :data:`SESSION_TTL_S`, and every session ends when the
token changes. The CSRF token lives inside that signed, HttpOnly cookie and
again in each form: a cross-site page can neither read the cookie nor
guess the token, and SameSite=Strict keeps the browser from sending the
cookie with a cross-site POST in the first place.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "COOKIE",
    "MIN_TOKEN_LENGTH",
    "SESSION_TTL_S",
    "SecurityHeaders",
    "Session",
    "Sessions",
    "add_headers",
    "cross_site",
]

#: The session cookie's name.
COOKIE = "alkstore_dashboard"
#: How long a login lasts, seconds.
SESSION_TTL_S = 12 * 3600
#: The shortest token the dashboard accepts.
MIN_TOKEN_LENGTH = 16

#: Sent with every response: no script but the dashboard's own file, no
#: inline script or style, no framing, forms post only to the dashboard.
HEADERS = (
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "same-origin"),
)


def add_headers(response: Response) -> None:
    """Add :data:`HEADERS` to ``response`` (those it does not set itself)."""
    for name, value in HEADERS:
        response.headers.setdefault(name, value)


class SecurityHeaders:
    """ASGI middleware adding :data:`HEADERS` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS:
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)


@dataclass(frozen=True)
class Session:
    """A logged-in browser: its CSRF token and when the login ends (epoch s)."""

    csrf: str
    expires: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    """Logins with the dashboard's token, kept in a signed cookie."""

    def __init__(self, token: str, ttl_s: int = SESSION_TTL_S) -> None:
        self._token = token.encode()
        self._key = hmac.new(self._token, b"alkstore-dashboard-session-v1", hashlib.sha256).digest()
        self._ttl_s = ttl_s

    def token_matches(self, given: str) -> bool:
        """Whether ``given`` is the token (in constant time)."""
        return hmac.compare_digest(given.encode(), self._token)

    def _sign(self, body: str) -> str:
        return _b64(hmac.new(self._key, body.encode("ascii"), hashlib.sha256).digest())

    def new_cookie(self) -> tuple[str, Session]:
        """A fresh session and its cookie value."""
        session = Session(secrets.token_urlsafe(32), int(time.time()) + self._ttl_s)
        body = _b64(json.dumps({"csrf": session.csrf, "exp": session.expires}).encode())
        return f"{body}.{self._sign(body)}", session

    def read(self, request: Request) -> Session | None:
        """The request's session: its cookie signed by this token, unexpired."""
        value = request.cookies.get(COOKIE)
        # Ours are ASCII; anything else (set by a sibling site, say) is no session.
        if not value or not value.isascii() or value.count(".") != 1:
            return None
        body, signature = value.split(".")
        if not hmac.compare_digest(signature, self._sign(body)):
            return None
        try:
            fields = json.loads(_unb64(body))
            session = Session(str(fields["csrf"]), int(fields["exp"]))
        except (binascii.Error, ValueError, KeyError, TypeError):
            return None
        return session if session.expires > time.time() else None

    def set_cookie(self, response: Response, request: Request, value: str) -> None:
        response.set_cookie(
            COOKIE,
            value,
            max_age=self._ttl_s,
            path=cookie_path(request),
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )

    @staticmethod
    def clear_cookie(response: Response, request: Request) -> None:
        response.delete_cookie(
            COOKIE,
            path=cookie_path(request),
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )

    @staticmethod
    def csrf_matches(session: Session, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), session.csrf.encode())


def cookie_path(request: Request) -> str:
    """The dashboard's own path: its root path (behind a proxy), else ``/``."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    return f"{root}/"


def cross_site(request: Request) -> str | None:
    """Why a POST is not from the dashboard's own pages, or ``None`` if it is.

    The browser's ``Origin`` must be the dashboard's origin (its scheme and
    ``Host``, as the proxy passes them); without an ``Origin``, the
    ``Referer``'s. A request with neither is refused: browsers send
    ``Origin`` with every POST.
    """
    own = f"{request.url.scheme}://{request.url.netloc}"
    origin = request.headers.get("origin")
    if origin is not None:
        return None if origin == own else f"the request comes from another site ({origin})"
    referer = request.headers.get("referer")
    if referer is None:
        return "the request names no Origin or Referer"
    parts = urlsplit(referer)
    if f"{parts.scheme}://{parts.netloc}" != own:
        return "the request comes from another site (its Referer)"
    return None
