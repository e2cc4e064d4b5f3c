"""Prometheus metrics of one App, read from Redis at scrape time (``GET /metrics`` of
``drumbeat dashboard``; needs the ``drumbeat[dashboard]`` extra for prometheus-client).

Nothing is counted in the scraping process: gauges are what Redis holds now, and counters and
histograms are the counts every worker adds in Redis as it settles jobs (`worker/tally.py`)
and the claim script adds as schedule runs start (the `lateness` hash). So any number of
worker processes on any number of machines add to the same counters, and a restarted
dashboard or a second one reports the same values.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from . import admin, scale_signal
from .connections import pipeline
from .protocol import bin_upper_ms
from .replies import text
from .worker.tally import DURATION_BUCKETS

if TYPE_CHECKING:
    from .app import App

__all__ = ["LATENESS_BUCKETS", "AppCollector", "JobCounts", "job_counts", "render"]

#: Upper bounds (seconds) of the schedule lateness histogram. The claim script counts runs in
#: finer log-spaced bins (~19 % wide); each bin is counted in the first bucket at or above its
#: upper bound, so a quantile read from these buckets is never below the true one.
LATENESS_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Histogram:
    """Non-cumulative counts per bucket (the last: above every bound) and the sum."""

    counts: tuple[int, ...]
    sum: float

    def cumulative(self, bounds: tuple[float, ...]) -> list[tuple[str, float]]:
        out, seen = [], 0
        for bound, n in zip((*map(str, bounds), "+Inf"), self.counts, strict=True):
            seen += n
            out.append((bound, float(seen)))
        return out


@dataclass(frozen=True, slots=True)
class JobCounts:
    """The counters the workers keep in Redis."""

    jobs: Mapping[tuple[str, str], int]
    """Settled attempts per (task, outcome)."""
    durations: Mapping[str, Histogram]
    """Run time per task, in seconds."""
    lateness: Histogram
    """Schedule runs' start lateness, in seconds, over every schedule shard."""


def _durations(
    fields: Mapping[str, int],
) -> tuple[dict[tuple[str, str], int], dict[str, Histogram]]:
    jobs: dict[tuple[str, str], int] = {}
    buckets: defaultdict[str, list[int]] = defaultdict(lambda: [0] * (len(DURATION_BUCKETS) + 1))
    micros: defaultdict[str, int] = defaultdict(int)
    for field, n in fields.items():
        kind, _, rest = field.partition("|")
        if kind == "s":
            micros[rest] += n
            continue
        middle, _, task = rest.partition("|")
        if kind == "j":
            jobs[task, middle] = n
        elif kind == "h" and middle.isdigit() and int(middle) <= len(DURATION_BUCKETS):
            buckets[task][int(middle)] += n
    hist = {t: Histogram(tuple(c), micros[t] / 1_000_000) for t, c in buckets.items()}
    return jobs, hist


def _lateness(shards: list[Mapping[Any, Any]]) -> Histogram:
    counts = [0] * (len(LATENESS_BUCKETS) + 1)
    total_ms = 0
    for fields in shards:
        for raw, value in fields.items():
            name = text(raw)
            if name == "cs":
                total_ms += int(value)
            elif name.startswith("c") and name[1:].isdigit():
                upper = bin_upper_ms(int(name[1:])) / 1000
                i = next((i for i, b in enumerate(LATENESS_BUCKETS) if upper <= b), -1)
                counts[i] += int(value)
    return Histogram(tuple(counts), total_ms / 1000)


def job_counts(app: App) -> JobCounts:
    """The workers' counters, in one round trip: theirs are in the main shard; each job shard
    also counts there the dependents its scripts dead-lettered (lua/_workflows.lua)."""
    n = len(app.job_keys)
    with pipeline(app.redis, transaction=False) as pipe:
        for keys in app.job_keys:
            pipe.hgetall(keys.metrics)
        for keys in app.scheduler.shards:
            pipe.hgetall(keys.lateness)
        raw = pipe.execute()
    fields: defaultdict[str, int] = defaultdict(int)
    for shard in raw[:n]:
        for k, v in shard.items():
            fields[text(k)] += int(v)
    jobs, durations = _durations(fields)
    return JobCounts(jobs, durations, _lateness(raw[n:]))


class AppCollector(Collector):
    """Every ``drumbeat_*`` metric of one App, read from Redis at each scrape."""

    def __init__(self, app: App) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        app = self.app
        stats = admin.queue_stats(app, running_limit=0)
        signal = scale_signal.read_signal(app)
        counts = job_counts(app)
        schedules = app.scheduler.count(app.redis)

        ready = GaugeMetricFamily(
            "drumbeat_queue_ready", "Jobs waiting to run, per queue and priority (9 runs first).",
            labels=["queue", "priority"],
        )  # fmt: skip
        for queue, by_priority in admin.ready_by_queue(stats).items():
            for priority, n in enumerate(by_priority):
                ready.add_metric([queue, str(priority)], n)
        yield ready
        yield GaugeMetricFamily(
            "drumbeat_queue_delayed", "Jobs waiting for a later time (delayed or backing off).",
            value=stats.delayed,
        )  # fmt: skip
        parked = GaugeMetricFamily(
            "drumbeat_queue_parked", "Jobs parked on a limiter key, waiting for a rate or "
            "concurrency limit, per queue.", labels=["queue"],
        )  # fmt: skip
        paused = GaugeMetricFamily(
            "drumbeat_queue_paused", "1 while the queue is paused (no worker takes its jobs), "
            "else 0, per queue.", labels=["queue"],
        )  # fmt: skip
        for waiting in stats.queues:
            parked.add_metric([waiting.name], waiting.parked)
            paused.add_metric([waiting.name], int(waiting.paused))
        yield parked
        yield paused
        yield GaugeMetricFamily(
            "drumbeat_jobs_running", "Jobs under a lease (running now).", value=stats.running_total
        )
        yield GaugeMetricFamily(
            "drumbeat_dead_letters", "Jobs in the dead-letter set.", value=stats.dead
        )
        total = CounterMetricFamily(
            "drumbeat_jobs", "Settled attempts per task and outcome (complete, failed, "
            "retried, dead, cancelled), counted in Redis by every worker.",
            labels=["task", "outcome"],
        )  # fmt: skip
        for (task, outcome), n in sorted(counts.jobs.items()):
            total.add_metric([task, outcome], n)
        yield total
        duration = HistogramMetricFamily(
            "drumbeat_job_duration_seconds", "Run time of settled attempts, per task.",
            labels=["task"],
        )  # fmt: skip
        for task, hist in sorted(counts.durations.items()):
            duration.add_metric([task], hist.cumulative(DURATION_BUCKETS), hist.sum)
        yield duration
        yield GaugeMetricFamily("drumbeat_schedules", "Schedules registered.", value=schedules)
        late = HistogramMetricFamily(
            "drumbeat_schedule_lateness_seconds", "How late schedule runs started (start - due).",
        )  # fmt: skip
        late.add_metric([], counts.lateness.cumulative(LATENESS_BUCKETS), counts.lateness.sum)
        yield late
        yield GaugeMetricFamily(
            "drumbeat_schedule_lag", "Entries due but not yet claimed: delayed jobs and "
            "schedule runs of due time slots.", value=signal.due_now,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "drumbeat_workers", "Worker processes heartbeating.", value=len(stats.workers)
        )
        yield GaugeMetricFamily(
            "drumbeat_desired_processes", "Worker processes the supervisors want, summed.",
            value=sum(s.desired for s in signal.supervisors),
        )  # fmt: skip


def render(app: App) -> bytes:
    """The Prometheus text exposition of ``app``'s metrics, read now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AppCollector(app))
    return generate_latest(registry)
