"""``drumbeat batches ls | show`` against the session's redis-server.

Batches are made with the API of a test app (`sync_app`) on the namespace that the CLI's app
module (``tests.apps.cli_app``) reads from the environment set up by `cli_env`, as in
test_cli.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import drumbeat
from tests.integration.test_batches_listing import make_batches, sync_app
from tests.integration.test_cli import APP, _forget_app_module, assert_clean_error, ok, row, run


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str) -> Iterator[None]:
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", redis_url)
    monkeypatch.setenv("DRUMBEAT_TEST_NAMESPACE", namespace)
    monkeypatch.setenv("COLUMNS", "250")  # one line per row
    _forget_app_module()
    yield
    _forget_app_module()


__all__ = ["sync_app"]  # a fixture, used by name


def test_batches_ls_lists_open_and_ended_batches_newest_first(
    cli_env: None, sync_app: drumbeat.App
) -> None:
    assert "no batches" in ok("batches", "ls", APP).output
    ended, still_open = make_batches(sync_app)
    out = ok("batches", "ls", APP).output
    assert out.index(still_open.id) < out.index(ended.id), "newest first"
    assert row(out, ended.id)[1:7] == ["ended", "2", "0", "1", "1", "0"]
    assert row(out, still_open.id)[1:7] == ["open", "1", "1", "0", "0", "0"]

    listed = json.loads(ok("batches", "ls", APP, "--json").output)["batches"]
    assert [b["id"] for b in listed] == [still_open.id, ended.id]
    first = listed[1]
    assert first["state"] == "closed" and first["ended"] is True
    assert (first["total"], first["succeeded"], first["failed"]) == (2, 1, 1)
    assert first["on_complete"] == ended.on_complete.id  # type: ignore[union-attr]
    assert first["made_at"].endswith("Z") and first["ended_ms"] >= first["made_ms"]
    assert [b["id"] for b in json.loads(ok("batches", "ls", APP, "-n", "1", "--json").output)[
        "batches"
    ]] == [still_open.id]  # fmt: skip


def test_batches_show_gives_counts_failed_members_and_callbacks(
    cli_env: None, sync_app: drumbeat.App
) -> None:
    ended, _ = make_batches(sync_app)
    failed_member = ended.jobs[1].id
    out = ok("batches", "show", APP, ended.id).output
    assert "ended" in out and failed_member in out
    assert f"{ended.on_complete.id} (complete)" in out  # type: ignore[union-attr]
    assert f"{ended.on_success.id} (cancelled)" in out  # type: ignore[union-attr]
    shown = json.loads(ok("batches", "show", APP, ended.id, "--json").output)
    assert shown["failed_ids"] == [failed_member]
    assert (shown["pending"], shown["succeeded"], shown["failed"]) == (0, 1, 1)
    assert_clean_error(run("batches", "show", APP, "f" * 32), 1, "does not exist")
