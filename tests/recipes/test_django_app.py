"""examples/recipes/django_app: a signup's welcome is enqueued only once its transaction commits
(``transaction.on_commit``), never when it rolls back; a worker then runs it against the same
SQLite database."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from drumbeat import admin
from drumbeat.testing import run_until_idle


class Refused(Exception):
    """Raised by a test to roll a transaction back."""


@pytest.fixture(scope="module")
def django_project(
    recipe_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ModuleType]:
    """Django set up on a SQLite file of this module's (worker threads open connections of their
    own, so no in-memory database), migrated; the worker module's tasks and App."""
    database = Path(tmp_path_factory.mktemp("django")) / "db.sqlite3"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECIPE_DJANGO_DB", str(database))
        mp.setenv("DJANGO_SETTINGS_MODULE", "examples.recipes.django_app.settings")
        # django.setup(), then the tasks: their App reads the environment set above.
        worker = importlib.import_module("examples.recipes.django_app.worker")
        from django.conf import settings
        from django.core.management import call_command

        assert settings.DATABASES["default"]["NAME"] == str(database), (
            "Django was set up earlier in this process, on another database"
        )
        assert worker.jobs.settings.namespace == recipe_env["DRUMBEAT_NAMESPACE"]
        call_command("migrate", verbosity=0)
        yield worker
        worker.jobs.close()
        from django import db

        db.connections.close_all()


def ready(worker: ModuleType) -> int:
    return admin.queue_stats(worker.jobs).ready


def test_a_rolled_back_signup_enqueues_nothing(django_project: ModuleType) -> None:
    from django.db import transaction
    from examples.recipes.django_app.models import Signup
    from examples.recipes.django_app.views import register

    with pytest.raises(Refused), transaction.atomic():
        register("rolled-back@example.com")  # its own atomic block: a savepoint in this one
        raise Refused

    assert not Signup.objects.filter(email="rolled-back@example.com").exists()
    assert ready(django_project) == 0
    assert run_until_idle(django_project.jobs) == 0


def test_a_committed_signup_is_enqueued_at_the_commit_and_run(django_project: ModuleType) -> None:
    from django.db import transaction
    from examples.recipes.django_app.views import register

    with transaction.atomic():
        signup = register("committed@example.com")
        assert ready(django_project) == 0, "enqueued before the transaction committed"
    assert ready(django_project) == 1

    assert run_until_idle(django_project.jobs) == 1
    signup.refresh_from_db()
    assert signup.welcomed_at is not None


def test_the_view_enqueues_and_a_worker_sends_the_welcome(django_project: ModuleType) -> None:
    from django.test import Client
    from examples.recipes.django_app.models import Signup

    answer = Client().post("/signups", {"email": "viewed@example.com"})
    assert answer.status_code == 202
    assert run_until_idle(django_project.jobs) == 1
    assert Signup.objects.get(pk=answer.json()["signup"]).welcomed_at is not None
