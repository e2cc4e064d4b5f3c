"""Which Redis a process uses, said aloud: the embedded fallback of an app given no URL (loud in a
process no one watches, refused by ``DRUMBEAT_EMBEDDED=0``), and the line a worker or supervisor
opens its log with, naming its Redis with any password masked.

Why: on a machine of a deployment where ``DRUMBEAT_REDIS_URL`` is missing, ``App()`` quietly
starts a private Redis, and the jobs its producers enqueue (or its workers wait for) are on that
machine alone. Nothing fails; work just seems lost. So the fallback is never silent.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO
from urllib.parse import unquote, urlsplit

from . import embedded
from .errors import ConfigurationError

if TYPE_CHECKING:
    from .connections import Connections

__all__ = ["announce", "attended", "describe", "embedded_socket", "fallback", "masked"]

log = logging.getLogger("drumbeat")

#: What a password is shown as.
HIDDEN = "***"

_FIX = (
    "set DRUMBEAT_REDIS_URL to the Redis every machine shares (e.g. redis://host:6379/0), or "
    "pass a URL to App()"
)


def fallback(*, allowed: bool, warn: bool = True) -> str:
    """The URL of the embedded Redis, for an app given no URL: started or reused.

    Args:
        allowed: `Settings.embedded`; False makes the missing URL an error.
        warn: Log the warning of a process no one watches (`attended`). A caller that names
            the Redis in a log line of its own first (`announce`) warns after it instead.

    Raises:
        ConfigurationError: If ``allowed`` is False, or the embedded Redis cannot start.
    """
    if not allowed:
        raise ConfigurationError(
            "No Redis URL: DRUMBEAT_REDIS_URL is not set and App() was given none, and "
            "DRUMBEAT_EMBEDDED=0 (Settings.embedded=False) forbids falling back to a private "
            f"embedded Redis on this machine. Expected a URL: {_FIX}."
        )
    url = embedded.ensure_running()
    if warn:
        warn_if_unattended(url)
    return url


def warn_if_unattended(url: str) -> None:
    """Warns, in a process not attached to a terminal (a service, a container, a cron job),
    that its jobs go to the embedded Redis of this machine: there, no one would notice."""
    if attended():
        return
    log.warning(
        "DRUMBEAT_REDIS_URL is not set (and App() was given no URL), so this process uses %s. "
        "Its jobs go to a private Redis on this machine only: producers and workers on other "
        "machines never see them. If this is a deployment, %s; set DRUMBEAT_EMBEDDED=0 to make "
        "a missing URL an error rather than this fallback.",
        _embedded_words(url),
        _FIX,
    )


def attended() -> bool:
    """Whether someone is likely watching this process: its stdin and stderr are terminals.

    Either one redirected (``< /dev/null`` under systemd, a pipe to a log collector, a
    container without ``-t``) counts as unattended: a warning too many on a terminal costs
    less than a silent fallback in production.
    """
    return all(_is_tty(stream) for stream in (sys.stdin, sys.stderr))


def _is_tty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):  # closed, or detached from its descriptor
        return False


def announce(connections: Connections) -> str:
    """Logs which Redis this process uses, as its first log line, then the warning of an
    unattended process that fell back to the embedded Redis; returns the URL.

    Raises:
        ConfigurationError: As `fallback` does.
    """
    fell_back = connections.given is None
    url = connections.resolve(warn=False)
    log.info("%s", describe(url))
    if fell_back:
        warn_if_unattended(url)
    return url


def describe(url: str) -> str:
    """``"Redis: <url>"`` with any password masked, saying when it is the embedded one."""
    if embedded_socket(url) is not None:
        return f"Redis: {_embedded_words(url)}"
    return f"Redis: {masked(url)}"


def _embedded_words(url: str) -> str:
    sock = embedded_socket(url) or Path(unquote(urlsplit(url).path))
    return (
        f"the embedded Redis at {masked(url)} (a private redis-server on this machine; "
        f"socket {sock}, data in {sock.parent})"
    )


def embedded_socket(url: str) -> Path | None:
    """The socket of the embedded Redis (`embedded.home`) if ``url`` names it, else None;
    given or fallen back to, it is the same private server."""
    if not url.lower().startswith("unix://"):
        return None
    path = Path(unquote(urlsplit(url).path))
    expected = embedded.home() / embedded.SOCKET_NAME
    return path if path == expected else None


def masked(url: str) -> str:
    """``url`` with the password of its ``user:password@`` and of any ``*password*=`` query
    option replaced by `HIDDEN`; the rest as it was (a log line must not leak a secret)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    # The netloc ends where redis-py's URL parsing (urllib's) ends it.
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    netloc, tail = rest[: min(ends, default=len(rest))], rest[min(ends, default=len(rest)) :]
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:{HIDDEN}@{hosts}"
    path, question, query = tail.partition("?")
    if question:
        query = "&".join(_masked_option(option) for option in query.split("&"))
    return f"{scheme}://{netloc}{path}{question}{query}"


def _masked_option(option: str) -> str:
    name, equals, _ = option.partition("=")
    # password=, sentinel_password=, ssl_password=: each a secret.
    if equals and "password" in unquote(name).lower():
        return f"{name}={HIDDEN}"
    return option
