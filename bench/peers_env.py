"""The peers' virtualenv, ``bench/.venv-peers``: the queues drumbeat is compared with (and
matplotlib for the charts), installed from the registry at the versions pinned in
``bench/requirements-peers.txt``, apart from drumbeat's own ``.venv``.

    python -m bench.peers_env        # create or update it; prints its python's path

`peers_python()` does the same from code. The venv is rebuilt only when the requirements file
changes (its hash is kept in the venv).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
VENV = BENCH_DIR / ".venv-peers"
REQUIREMENTS = BENCH_DIR / "requirements-peers.txt"
_STAMP = VENV / ".requirements-sha256"


class PeersEnvError(RuntimeError):
    """The venv could not be made or its packages not installed."""


def _python() -> Path:
    return VENV / "bin" / "python"


def _wanted() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def existing_python() -> Path | None:
    """The venv's python if the venv is there and up to date, without installing anything."""
    ok = _python().exists() and _STAMP.exists() and _STAMP.read_text().strip() == _wanted()
    return _python() if ok else None


def _run(argv: list[str]) -> None:
    out = subprocess.run(argv, stdout=sys.stderr, stderr=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-10:])
        raise PeersEnvError(f"`{' '.join(argv)}` exited with {out.returncode}:\n{tail}")


def peers_python() -> Path:
    """The python of an up-to-date ``bench/.venv-peers``, made (with this interpreter's
    ``venv``, so the same Python version) or updated first."""
    found = existing_python()
    if found is not None:
        return found
    print(f"peers_env: installing {REQUIREMENTS.name} into {VENV}", file=sys.stderr, flush=True)
    if not _python().exists():
        shutil.rmtree(VENV, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(VENV)])
        _run([str(_python()), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    _STAMP.unlink(missing_ok=True)
    _run([str(_python()), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)])
    _STAMP.write_text(_wanted() + "\n")
    return _python()


if __name__ == "__main__":
    try:
        print(peers_python())
    except PeersEnvError as exc:
        sys.exit(f"peers_env: {exc}")
