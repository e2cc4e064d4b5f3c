"""Which Redis errors the worker waits out (`is_transient`), as the servers phrase them."""

from __future__ import annotations

import logging

import pytest
import redis

from drumbeat.worker.retrying import Backoff, is_migrating, is_transient

# Error replies as redis-py raises them: Redis 7 keeps a script's error code in front, Redis 6.2
# wraps it ("Error running script ... -OOM ..."), and a server turned replica unblocks waits.
_SCRIPT_62 = "Error running script (call to f_822b073c94e0724d4f243511284805431329fe95): "
_TRANSIENT = [
    redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
    redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
    redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
    redis.ResponseError("BUSY Redis is busy running a script. You can only call SCRIPT KILL"),
    redis.ResponseError(
        "UNBLOCKED force unblock from blocking operation, instance state changed "
        "(master -> replica?)"
    ),
    redis.ResponseError(
        _SCRIPT_62 + "@user_script:361: @user_script: 361: -OOM command not allowed when used "
        "memory > 'maxmemory'."
    ),
    redis.ResponseError(
        _SCRIPT_62 + "@user_script:365: @user_script: 365: -READONLY You can't write against a "
        "read only replica."
    ),
    redis.ConnectionError("Connection closed by server."),
    redis.TimeoutError("Timeout reading from socket"),
    # A Redis Cluster's slots moving or failing over (redis-py strips the reply's code).
    redis.exceptions.MovedError("3999 127.0.0.1:7002"),
    redis.exceptions.AskError("3999 127.0.0.1:7002"),
    redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
    redis.exceptions.ClusterDownError("The cluster is down"),
    redis.exceptions.MasterDownError("Link with MASTER is down and replica-serve-stale-data is no"),
    redis.exceptions.SlotNotCoveredError('Slot "3999" is not covered by the cluster.'),
]
_PERMANENT = [
    redis.ResponseError("ERR wrong number of arguments for 'evalsha' command"),
    redis.ResponseError(
        _SCRIPT_62 + "@user_script:49: user_script:49: attempt to compare nil with number"
    ),
    redis.ResponseError("ERR user_script:1: too many results to unpack script: 611ecd10"),
    redis.exceptions.NoPermissionError("this user has no permissions to run the 'bzpopmin'"),
    redis.exceptions.ClusterCrossSlotError("Keys in request don't hash to the same slot"),
]


@pytest.mark.parametrize("exc", _TRANSIENT, ids=lambda e: str(e)[:40])
def test_transient(exc: Exception) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize("exc", _PERMANENT, ids=lambda e: str(e)[:40])
def test_not_transient(exc: Exception) -> None:
    assert not is_transient(exc)


def test_a_migrating_slot_is_told_from_other_errors() -> None:
    """ASK, TRYAGAIN and redis-py's cluster client giving up after many of them are tried
    again at once (`Backoff.failed`); a MOVED, a cluster down or any other error backs off."""
    migrating = [
        redis.exceptions.AskError("3999 127.0.0.1:7002"),
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        redis.exceptions.ClusterError("TTL exhausted."),
    ]
    others = [
        redis.exceptions.MovedError("3999 127.0.0.1:7002"),
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.ClusterError("Cluster is down"),
        redis.ConnectionError("Connection closed by server."),
    ]
    assert [is_migrating(e) for e in migrating] == [True] * 3
    assert [is_migrating(e) for e in others] == [False] * 4


def test_backoff_tries_again_at_once_after_one_moved_and_backs_off_after_two(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A MOVED ends a resharding or a failover: the next try goes to the slot's new owner, so
    it is not waited for nor warned about; MOVED after MOVED is a cluster in disagreement."""
    log = logging.getLogger("test.backoff")
    backoff = Backoff(first=0.05, most=5.0)
    moved = redis.exceptions.MovedError("3999 127.0.0.1:7002")
    with caplog.at_level(logging.INFO, logger="test.backoff"):
        assert backoff.failed(log, "claiming", moved) == 0.0
        assert backoff.failed(log, "claiming", moved) == 0.05
        assert backoff.failed(log, "claiming", moved) == 0.1
        backoff.reset()
        assert backoff.failed(log, "claiming", moved) == 0.0
    levels = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records]
    assert levels == [
        ("INFO", "claiming"),
        ("WARNING", "claiming failed (MovedError"),
        ("WARNING", "claiming failed (MovedError"),
        ("INFO", "claiming"),
    ]
