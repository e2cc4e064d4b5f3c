"""What ``drumbeat worker examples.recipes.django_app.worker:jobs`` loads: a worker process is no
Django process, so Django is set up before the tasks (and their models) are imported."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.recipes.django_app.settings")
django.setup()

from .tasks import jobs  # noqa: E402 (models can be imported only once Django is set up)

__all__ = ["jobs"]
