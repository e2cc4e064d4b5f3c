"""What a log line shows of a Redis URL (`which_redis.masked`, `describe`), and the setting that
forbids the embedded fallback, read from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from drumbeat.config import Settings
from drumbeat.which_redis import describe, masked


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://app:p@ss:w@rd@h:6380/1", "rediss://app:***@h:6380/1"),
        ("redis://app@h/0", "redis://app@h/0"),  # a user name alone is no secret
        ("redis+cluster://u:pw@a:7000,b:7001", "redis+cluster://u:***@a:7000,b:7001"),
        ("redis+sentinel://:pw@s1:26379,s2:26379/main/0?sentinel_password=spw&socket_timeout=2",
         "redis+sentinel://:***@s1:26379,s2:26379/main/0?sentinel_password=***&socket_timeout=2"),
        ("unix://u:pw@/run/redis.sock?db=0&password=pw", "unix://u:***@/run/redis.sock?db=0&password=***"),
        ("rediss://h?ssl_ca_certs=/etc/ca.pem&ssl_password=k", "rediss://h?ssl_ca_certs=/etc/ca.pem&ssl_password=***"),
    ],
)  # fmt: skip
def test_masked_hides_every_password_and_keeps_the_rest(url: str, shown: str) -> None:
    assert masked(url) == shown


def test_describe_tells_the_embedded_socket_from_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRUMBEAT_HOME", str(tmp_path))
    own = describe(f"unix://{tmp_path}/redis.sock?db=0")
    assert own.startswith("Redis: the embedded Redis at unix://")
    assert f"socket {tmp_path}/redis.sock, data in {tmp_path}" in own
    assert (
        describe("unix:///run/redis/redis.sock?db=0") == "Redis: unix:///run/redis/redis.sock?db=0"
    )


@pytest.mark.parametrize(("raw", "embedded"), [("0", False), ("false", False), ("1", True)])
def test_drumbeat_embedded_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, embedded: bool
) -> None:
    monkeypatch.setenv("DRUMBEAT_EMBEDDED", raw)
    assert Settings.from_env().embedded is embedded
    monkeypatch.delenv("DRUMBEAT_EMBEDDED")
    assert Settings.from_env().embedded is True  # zero set-up stays the default
