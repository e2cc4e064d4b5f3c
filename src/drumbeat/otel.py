"""OpenTelemetry tracing (``pip install 'drumbeat[otel]'``): a producer span per enqueue and a
consumer span per run, linked through the W3C trace context the producer injects into the
job's headers. Attributes follow the OpenTelemetry messaging semantic conventions.

    import drumbeat.otel
    drumbeat.otel.instrument(app)

Only ``opentelemetry-api`` is needed: the application sets up its SDK and exporter (or not:
without an SDK every span is a no-op and costs little).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Link, Span, SpanKind, StatusCode, Tracer, TracerProvider

from . import __version__
from .app import App
from .middleware import Enqueueing, Middleware
from .worker.hooks import JobEnd, JobInfo

SYSTEM = "drumbeat"
_NO_PARENT = context.Context()  # a run whose job has no headers starts a trace
_KEY = "otel"  # in Enqueueing.notes and JobInfo.notes: (span, context token)


class Tracing(Middleware):
    """Job middleware that traces enqueues and runs.

    Args:
        tracer_provider: where spans go; default the global one (``trace.set_tracer_provider``),
            looked up when each span starts, so it may be set after `instrument`.
    """

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self.tracer: Tracer = trace.get_tracer(
            "drumbeat", __version__, tracer_provider=tracer_provider
        )

    def before_enqueue(self, job: Enqueueing) -> None:
        # A child of whatever is current where the job is enqueued (a request, say).
        span = self.tracer.start_span(
            f"send {job.queue}",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": job.queue,
                "messaging.message.id": job.id,
                "drumbeat.task": job.task,
                "drumbeat.priority": job.priority,
            },
        )
        # traceparent (and tracestate, baggage: whatever the global propagator carries)
        propagate.inject(job.headers, context=trace.set_span_in_context(span))
        job.notes[_KEY] = span

    def after_enqueue(self, job: Enqueueing, error: BaseException | None) -> None:
        span: Span | None = job.notes.pop(_KEY, None)
        if span is None:
            return
        # A deduplicated enqueue answers with the existing job's id: the message it refers to.
        span.set_attribute("messaging.message.id", job.id)
        if job.created is not None:
            span.set_attribute("drumbeat.created", job.created)
        if error is not None:
            span.record_exception(error)
            span.set_status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
        span.end()

    def before_run(self, job: JobInfo) -> None:
        headers = job.headers
        links = None
        parent = _NO_PARENT
        if headers:
            parent = propagate.extract(headers)
            producer = trace.get_current_span(parent).get_span_context()
            links = [Link(producer)] if producer.is_valid else None
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": job.id,
            "drumbeat.task": job.task,
            "drumbeat.attempt": job.attempt,
            "drumbeat.priority": job.priority,
        }
        if job.schedule_id is not None:
            attributes["drumbeat.schedule_id"] = job.schedule_id
        # A child of the producer's span (one trace from the request to the run), and linked
        # to it as the conventions ask of a process span; a schedule's run starts a trace.
        span = self.tracer.start_span(
            f"process {job.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )
        # Current for the task: the runner runs it in this asyncio task's context (a sync
        # task in a copy of it), so spans the task starts are children of this one. A span
        # with no valid context (no SDK: a no-op) would parent nothing: not attached.
        token = None
        if span.get_span_context().is_valid:
            token = context.attach(trace.set_span_in_context(span, parent))
        job.notes[_KEY] = (span, token)

    def after_run(self, end: JobEnd) -> None:
        held: tuple[Span, object | None] | None = end.job.notes.pop(_KEY, None)
        if held is None:
            return
        span, token = held
        span.set_attribute("drumbeat.outcome", end.outcome)
        if end.failed:
            span.set_status(StatusCode.ERROR, end.error or end.outcome)
        span.end()
        if token is not None:
            context.detach(token)  # type: ignore[arg-type]  # the token attach returned


def instrument(app: App, tracer_provider: TracerProvider | None = None) -> Tracing:
    """Traces ``app``'s enqueues and runs (`Tracing`, registered with `App.middleware`);
    returns the middleware."""
    tracing = Tracing(tracer_provider)
    app.middleware(tracing)
    return tracing
