"""FastAPI: enqueue from a request handler, with the drumbeat App opened and closed in the web
app's ``lifespan``.

    uvicorn examples.recipes.fastapi_app:api            # the web app
    drumbeat worker examples.recipes.fastapi_app:jobs   # a worker (the same code, so the task)

Both read ``DRUMBEAT_REDIS_URL`` (with none, the embedded Redis of this machine).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from pydantic import BaseModel

import drumbeat

jobs = drumbeat.App()


# An explicit name: the worker finds the task by it, however the module was imported.
@jobs.task(name="recipes.send_welcome", retries=3, timeout=30)
async def send_welcome(email: str) -> str:
    """Runs on a worker, never in the request: a slow mail service cannot slow the page."""
    return f"welcome sent to {email}"


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    # Connect at start-up, so an unreachable Redis fails the deploy rather than the first request.
    await (await jobs.aredis()).ping()
    yield
    await jobs.aclose()  # the client of this event loop (aenqueue's)


api = FastAPI(lifespan=lifespan)


class Signup(BaseModel):
    email: str


class Enqueued(BaseModel):
    job: str
    duplicate: bool


class Status(BaseModel):
    status: drumbeat.JobStatus


@api.post("/signups", status_code=202)
async def signup(body: Signup) -> Enqueued:
    # The key makes a double-submitted form one job: the second enqueue returns the first's.
    job = await send_welcome.options(key=f"welcome:{body.email}").aenqueue(body.email)
    return Enqueued(job=job.id, duplicate=job.duplicate)


@api.get("/jobs/{job_id}")
async def job_status(job_id: str) -> Status:
    return Status(status=await jobs.job(job_id).astatus())
