from __future__ import annotations

from django.apps import AppConfig


class SignupsConfig(AppConfig):
    name = "examples.recipes.django_app"
    label = "django_app"
