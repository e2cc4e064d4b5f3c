"""An app with job middleware, for the test that ``drumbeat worker`` runs it.

``DRUMBEAT_REDIS_URL``, ``DRUMBEAT_TEST_NAMESPACE`` and ``DRUMBEAT_TEST_MW_LOG`` (a file the
middleware appends one JSON line to per run) must be set before it is imported.
"""

from __future__ import annotations

import json
import os

import drumbeat

app = drumbeat.App(
    os.environ["DRUMBEAT_REDIS_URL"], namespace=os.environ["DRUMBEAT_TEST_NAMESPACE"]
)


@app.middleware
class Record(drumbeat.Middleware):
    """Writes what each run looked like to the log file."""

    def before_run(self, job: drumbeat.JobInfo) -> None:
        job.notes["seen_before"] = True

    def after_run(self, end: drumbeat.JobEnd) -> None:
        job = end.job
        line = {"id": job.id, "task": job.task, "queue": job.queue, "attempt": job.attempt,
                "headers": job.headers, "outcome": end.outcome, "before": job.notes["seen_before"],
                "duration": end.duration}  # fmt: skip
        with open(os.environ["DRUMBEAT_TEST_MW_LOG"], "a") as log:
            log.write(json.dumps(line) + "\n")


@app.task(name="mw.echo")
def echo(text: str) -> dict[str, str]:
    return {"text": text, **drumbeat.current_job().headers}
