"""`drumbeat status` shows the supervisors (host, pid, processes live/desired, MIN:MAX, why and
when they last scaled) and ``--json`` exports them with the desired capacity and its inputs."""

from __future__ import annotations

import json
import re
import socket

import pytest

import drumbeat
from drumbeat.autoscale import Autoscaler
from tests.integration.test_cli import APP, ok, row, run
from tests.integration.test_cli_output import cli_env, fitted, parse_iso

__all__ = ["cli_env"]  # the fixture, imported for this module's tests


def test_status_lists_the_supervisors_and_json_exports_the_desired_capacity(
    cli_env: None, app: drumbeat.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = Autoscaler(app, minimum=1, maximum=3, concurrency=2)
    b = Autoscaler(app, minimum=2, maximum=4, concurrency=2)
    try:
        monkeypatch.setattr(socket, "gethostname", lambda: "box-b")
        b.look(live=2, desired=2, retiring=0, now=0.0)
        monkeypatch.setattr(socket, "gethostname", lambda: "box-a")
        a.look(live=1, desired=1, retiring=0, now=0.0)
        app.enqueue_many([drumbeat.Prepared("add", [1], {})] * 9)
        a.look(live=1, desired=1, retiring=0, now=1.0)  # scales to 3 for the backlog
        a.look(live=2, desired=3, retiring=0, now=2.0)  # the registration says so
        lines = fitted(ok("status", APP))
        text = "\n".join(lines)
        assert "Supervisors" in text
        cells = row(text, "box-a")
        assert cells[2:5] == ["2/3", "1:3", cells[4]] and re.fullmatch(r"[\d.]+s ago", cells[4])
        assert cells[5].startswith("9 ready (p0 9)"), cells
        wide = ok("status", APP, "--wide").stdout
        assert a.id in wide and b.id in wide
        doc = ok("status", APP, "--json")
    finally:
        a.close()
        b.close()
    data = json.loads(doc.stdout)
    sups = {s["id"]: s for s in data["supervisors"]}
    assert set(sups) == {a.id, b.id}
    mine = sups[a.id]
    assert (mine["host"], mine["live"], mine["desired"], mine["min"], mine["max"]) == (
        "box-a", 2, 3, 1, 3,
    )  # fmt: skip
    assert mine["reason"].startswith("9 ready") and mine["needed"] == 5
    assert parse_iso(mine["reason_at"]).timestamp() * 1000 == pytest.approx(mine["reason_ms"])
    assert 0 <= data["now_ms"] - mine["heartbeat_ms"] < 60_000, "the heartbeat is its last beat"
    scaling = data["autoscale"]
    assert scaling["ready"] == 9 and scaling["ready_by_priority"][0] == 9
    assert scaling["slots_needed"] == 9
    assert scaling["concurrency"] == app.settings.concurrency
    assert scaling["processes_needed"] == -(-9 // app.settings.concurrency)
    assert (scaling["supervised_live"], scaling["supervised_desired"]) == (4, 5)
    assert scaling["supervised_max"] == 7
    for key in ("due_unclaimed", "schedule_lag_ms", "lateness_p99_ms", "running", "slots"):
        assert key in scaling


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--autoscale", "3:1"], "1 <= MIN <= MAX <= 256"),
        (["--autoscale", "0:2"], "1 <= MIN <= MAX <= 256"),
        (["--autoscale", "1:999"], "1 <= MIN <= MAX <= 256"),
        (["--autoscale", "4"], "expects MIN:MAX"),
        (["--autoscale", "1:2", "--processes", "2"], "exclude each other"),
    ],
)
def test_bad_autoscale_bounds_are_refused(cli_env: None, args: list[str], says: str) -> None:
    result = run("worker", APP, *args)
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split())
