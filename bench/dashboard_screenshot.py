"""The screenshot of the dashboard's overview in docs/dashboard.md, taken after a real workload.

    python -m bench.dashboard_screenshot [--seconds 240] [--out docs/img/dashboard-overview.png]

A private redis-server; two worker processes (the tasks of `define`) running a stream of
jobs whose rate rises and falls (a few fail, some retry), 300 schedules every 5 s and one every
second; then the overview in headless Chromium (Debian's ``/usr/bin/chromium``, or
``DRUMBEAT_TEST_CHROMIUM``), 1100 px wide, saved as PNG (about 90 KB).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import drumbeat


def define(app: drumbeat.App) -> drumbeat.App:
    """The workload's tasks, on ``app``."""

    @app.task(name="thumbnails.resize", retries=2, backoff=0.2)
    async def resize(image: str) -> str:
        await asyncio.sleep(random.uniform(0.005, 0.04))
        if random.random() < 0.03:
            raise OSError(f"cannot read {image}")
        return image

    @app.task(name="reports.build")
    async def build(report: int) -> None:
        await asyncio.sleep(random.uniform(0.005, 0.02))

    @app.task(name="export.csv")
    async def export(rows: int) -> None:
        for i in range(rows):
            await drumbeat.acheckpoint({"rows": i})
            await asyncio.sleep(1)

    return app


def _produce(producer: drumbeat.App, seconds: float) -> None:
    started = time.monotonic()
    n = 0
    while (elapsed := time.monotonic() - started) < seconds:
        rate = 60 + 45 * math.sin(elapsed / 40)  # jobs per second, rising and falling
        batch = [
            drumbeat.Prepared("thumbnails.resize", [f"img/{n + i}.jpg"], {},
                              drumbeat.Options(priority=random.choice((0, 0, 0, 5, 9))))
            for i in range(max(1, round(rate / 5)))
        ]  # fmt: skip
        producer.enqueue_many(batch)
        n += len(batch)
        time.sleep(0.2)


def main() -> None:
    from playwright.sync_api import sync_playwright

    from bench.dashboard import _free_port, _redis
    from drumbeat.dashboard import Guard, create_app

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--out", default="docs/img/dashboard-overview.png")
    args = parser.parse_args()

    proc, url, folder = _redis()
    env = {**os.environ, "DRUMBEAT_REDIS_URL": url, "DRUMBEAT_NAMESPACE": "shop"}
    code = (
        "import drumbeat; from bench.dashboard_screenshot import define; "
        "drumbeat.run_worker(define(drumbeat.App()))"
    )
    workers = [
        subprocess.Popen([sys.executable, "-c", code], env={**env, "DRUMBEAT_CONCURRENCY": "8"})
        for _ in range(2)
    ]
    producer = define(drumbeat.App(url, namespace="shop"))
    try:
        producer.schedule_many(
            [drumbeat.Schedule(f"report:{i}", "reports.build", every=5, args=(i,))
             for i in range(300)]
            + [drumbeat.Schedule("heartbeat", "reports.build", every=1, args=(0,))]
        )  # fmt: skip
        producer.enqueue_many([drumbeat.Prepared("export.csv", [100_000], {})] * 2)
        _produce(producer, args.seconds)

        import uvicorn

        port = _free_port()
        config = uvicorn.Config(
            create_app(producer, Guard(host="127.0.0.1")), host="127.0.0.1", port=port,
            log_level="warning", lifespan="off",
        )  # fmt: skip
        server = uvicorn.Server(config)
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.02)
        chromium = os.environ.get("DRUMBEAT_TEST_CHROMIUM") or shutil.which("chromium")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True)
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/")
            page.screenshot(path=args.out, full_page=True)
            browser.close()
        server.should_exit = True
        print(f"{args.out}: {Path(args.out).stat().st_size:,} bytes")
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(30)
        producer.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
