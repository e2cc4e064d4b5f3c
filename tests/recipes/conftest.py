"""The recipes read their Redis as a user's app does, from ``DRUMBEAT_REDIS_URL`` (and
``DRUMBEAT_NAMESPACE``) when their module is imported: each test module points them at the
session's redis-server, on a namespace of its own, and imports them afresh."""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.conftest import RedisServer


@pytest.fixture(scope="module")
def recipe_env(redis_server: RedisServer) -> Iterator[dict[str, str]]:
    """The environment a recipe runs in; set in this process for the module's tests."""
    env = {
        "DRUMBEAT_REDIS_URL": redis_server.url,
        "DRUMBEAT_NAMESPACE": f"r{uuid.uuid4().hex[:12]}",
    }
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        yield env


def fresh_import(name: str) -> ModuleType:
    """Imports module ``name`` anew, so its module-level App reads the environment of this test
    (the modules it imports stay as they are: Django's models register once per process)."""
    sys.modules.pop(name, None)
    return importlib.import_module(name)
