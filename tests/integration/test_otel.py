"""`drumbeat.otel` on a real Redis and a real worker, spans read from the SDK's in-memory
exporter: one trace from the enqueue to the run, messaging attributes, error status."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import drumbeat
import drumbeat.otel
from drumbeat.testing import arun_until_idle


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _one(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    [span] = [s for s in spans if s.name == name]
    return span


async def test_an_enqueue_and_its_run_are_one_trace(
    app: drumbeat.App, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, spans = exporter
    drumbeat.otel.instrument(app, tracer_provider=provider)
    tracer = provider.get_tracer("test")

    @app.task(name="otel.work", queue="builds")
    def work() -> str:
        with tracer.start_as_current_span("inside the task"):  # in the task's thread
            return drumbeat.current_job().headers["traceparent"]

    with tracer.start_as_current_span("request"):
        job = await work.aenqueue()
    assert await arun_until_idle(app, queues=["builds"]) == 1
    traceparent = await job.aresult(timeout=1)

    done = spans.get_finished_spans()
    request, send = _one(done, "request"), _one(done, "send builds")
    process, inside = _one(done, "process builds"), _one(done, "inside the task")
    assert send.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    trace_id = request.context.trace_id
    assert {s.context.trace_id for s in (send, process, inside)} == {trace_id}, "one trace"
    assert send.parent is not None and send.parent.span_id == request.context.span_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    assert inside.parent is not None and inside.parent.span_id == process.context.span_id
    assert f"{send.context.span_id:016x}" in traceparent, "W3C trace context in the headers"
    assert dict(send.attributes or {}) == {
        "messaging.system": "drumbeat", "messaging.operation.type": "send",
        "messaging.operation.name": "send", "messaging.destination.name": "builds",
        "messaging.message.id": job.id, "drumbeat.task": "otel.work", "drumbeat.priority": 0,
        "drumbeat.created": True,
    }  # fmt: skip
    attributes = dict(process.attributes or {})
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == "builds"
    assert attributes["messaging.message.id"] == job.id
    assert (attributes["drumbeat.task"], attributes["drumbeat.attempt"]) == ("otel.work", 1)
    assert attributes["drumbeat.outcome"] == "done"
    assert process.status.status_code is StatusCode.UNSET


async def test_a_failed_run_has_error_status_and_each_attempt_its_span(
    app: drumbeat.App, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, spans = exporter
    drumbeat.otel.instrument(app, tracer_provider=provider)

    @app.task(name="otel.fails", retries=1, backoff=0.01)
    async def fails() -> None:
        raise ValueError("no such thing")

    await fails.aenqueue()
    assert await arun_until_idle(app) == 2
    runs = sorted(
        (s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER),
        key=lambda s: (s.attributes or {})["drumbeat.attempt"],
    )
    [send] = [s for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    assert [(s.attributes or {})["drumbeat.outcome"] for s in runs] == ["retry", "dead"]
    for run in runs:
        assert run.status.status_code is StatusCode.ERROR
        assert "ValueError: no such thing" in (run.status.description or "")
        assert run.parent is not None and run.parent.span_id == send.context.span_id


async def test_without_an_sdk_spans_are_no_ops_and_add_no_headers(app: drumbeat.App) -> None:
    drumbeat.otel.instrument(app, tracer_provider=trace.NoOpTracerProvider())
    seen: list[dict[str, str]] = []

    @app.task
    async def plain() -> None:
        seen.append(drumbeat.current_job().headers)

    await plain.aenqueue()
    await arun_until_idle(app)
    assert seen == [{}]
