"""Django's command line for this project: ``python -m examples.recipes.django_app.manage``."""

from __future__ import annotations

import os
import sys

from django.core.management import execute_from_command_line

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.recipes.django_app.settings")
    execute_from_command_line(sys.argv)
