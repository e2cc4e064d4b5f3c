"""The project's settings: the smallest Django project that has a database and one view."""

from __future__ import annotations

import os
from pathlib import Path

SECRET_KEY = "recipe-only-not-a-secret"  # a recipe; a real project reads its own
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
INSTALLED_APPS = ["examples.recipes.django_app"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "examples.recipes.django_app.urls"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("RECIPE_DJANGO_DB", str(Path(__file__).with_name("db.sqlite3"))),
    }
}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
