"""`App.task_ref`: a task by name, for producers that do not import its code, with the same
per-call options as `Task.options` and its arguments kept apart from them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, Unpack

from .errors import InvalidJob
from .job import Job
from .keys import DEFAULT_QUEUE
from .names import check_name
from .task import LIMIT_OPTIONS, Bound, CallOptions, Options, Prepared, Task, call_options

if TYPE_CHECKING:
    from .app import App

P = ParamSpec("P")
R = TypeVar("R")


class TaskRef(Generic[P, R]):
    """A task named, not imported: ``app.task_ref("tasks.build").options(priority=9)
    .enqueue(42)``. Typed ``TaskRef[..., Any]``; annotate it (``TaskRef[[int], None]``) to
    have mypy check the arguments.

    A task registered in this process keeps its own defaults (queue, priority, unique_for) and
    limits, as `Task.options` does. For a task this process does not know, its definition is
    elsewhere, so what it would have set must be said here: ``queue`` (default: the default
    queue) and ``priority`` (default 0) given to `App.task_ref` are its defaults, shown in its
    repr; the worker still runs it with its own retries, timeout and limits.
    """

    def __init__(
        self, app: App, name: str, *, queue: str | None = None, priority: int | None = None
    ) -> None:
        try:
            check_name(name, "task name")
        except ValueError as exc:
            raise InvalidJob(str(exc)) from None
        self.app = app
        self._name = name
        self.task: Task[Any, Any] | None = app.tasks.get(name)
        """The task, when it is registered in this process."""
        if self.task is not None:
            c = self.task.config
            queue = c.queue if queue is None else queue
            priority = c.priority if priority is None else priority
        # Options checks both; None in `Options.unique_for` takes the task's at enqueue.
        self._defaults = Options(
            priority=0 if priority is None else priority, queue=queue or DEFAULT_QUEUE
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def queue(self) -> str:
        """The queue its jobs go to unless `options` names another."""
        return self._defaults.queue or DEFAULT_QUEUE

    @property
    def priority(self) -> int:
        """Its jobs' priority unless `options` gives one."""
        return self._defaults.priority

    def __repr__(self) -> str:
        where = "registered here" if self.task is not None else "not registered here"
        return f"<TaskRef {self.name} ({where}) queue={self.queue} priority={self.priority}>"

    def options(self, **given: Unpack[CallOptions]) -> Bound[P, R]:
        """Per-call options (`CallOptions`), as `Task.options` takes them. Limits need the task
        registered here: a call's limits replace its task's as a whole in the job's record, and
        a process that does not know the task cannot fill in the ones not given."""
        what = f"task_ref({self.name!r}).options(...)"
        limits = None
        if self.task is not None:
            limits = self.task.call_limits(what, **given)
        elif named := [k for k in LIMIT_OPTIONS if given.get(k) is not None]:
            raise InvalidJob(
                f"{', '.join(named)} by name needs task {self.name!r} registered in this "
                "process (its limits are merged with the call's here); import its module, or "
                "set its limits on its definition"
            )
        return Bound(self, call_options(given, what, self.priority, self.queue, limits))

    def prepare(self, *args: P.args, **kwargs: P.kwargs) -> Prepared:
        """A job for `App.enqueue_many`, with this reference's defaults."""
        return Prepared(self.name, args, kwargs, self._defaults)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        return self.app.enqueue_many([self.prepare(*args, **kwargs)])[0]

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        return (await self.app.aenqueue_many([self.prepare(*args, **kwargs)]))[0]
