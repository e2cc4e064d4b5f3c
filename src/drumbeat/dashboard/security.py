"""Who may use the dashboard, and which requests may change anything.

- Bound to loopback (the default) it needs no token, but answers only requests whose ``Host``
  is a loopback name, so a web page that rebinds its own DNS name to 127.0.0.1 cannot read it.
- Bound to anything else it refuses to start without ``DRUMBEAT_DASHBOARD_TOKEN``; with a token
  (on any bind) every request must carry it, as ``Authorization: Bearer <token>`` or as the
  cookie the login form sets (Secure, HttpOnly, SameSite=Strict, holding an HMAC of the token,
  not the token).
- Every state-changing request is a POST carrying the CSRF token the pages embed (an HMAC of
  the token, or without one of a secret made at start); ``--read-only`` refuses them all.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["COOKIE", "TOKEN_ENV", "Guard", "InsecureBind", "is_loopback"]

TOKEN_ENV = "DRUMBEAT_DASHBOARD_TOKEN"
COOKIE = "drumbeat_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"

LOOPBACK_NAMES = ("localhost", "localhost.")


class InsecureBind(Exception):
    """A bind beyond loopback without a token."""


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port (``[::1]:8787`` -> ``::1``)."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass
class Guard:
    host: str
    token: str | None = None
    read_only: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def __post_init__(self) -> None:
        if not is_loopback(self.host) and not self.token:
            raise InsecureBind(
                f"refusing to serve the dashboard on {self.host!r}, beyond loopback, without a "
                f"token: set {TOKEN_ENV} (every request must then carry it), or bind to "
                "127.0.0.1 (the default)"
            )

    @property
    def session(self) -> str:
        """The login cookie's value: proves the token was given, without holding it."""
        assert self.token is not None
        return hmac.new(self.token.encode(), b"drumbeat-dashboard-session", "sha256").hexdigest()

    @property
    def csrf(self) -> str:
        # With a token, derived from it, so that every replica behind one address accepts the
        # pages of the others; without one, from the secret this process made.
        key = self.token.encode() if self.token else self.secret
        return hmac.new(key, b"drumbeat-dashboard-csrf", hashlib.sha256).hexdigest()

    def authenticated(self, request: Request) -> bool:
        if self.token is None:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), self.token.encode()):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode(), self.session.encode())

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def host_allowed(self, request: Request) -> bool:
        """On a loopback bind, only loopback ``Host`` names (DNS rebinding)."""
        if not is_loopback(self.host):
            return True
        return is_loopback(_host_name(request.headers.get("host", "")))

    def csrf_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.csrf.encode())

    def set_session(self, response: Response) -> None:
        response.set_cookie(
            COOKIE, self.session, httponly=True, secure=True, samesite="strict", path="/"
        )
