"""The drumbeat App and its tasks. Imported by the views (to enqueue) and by the worker (to run:
see worker.py, which sets Django up first)."""

from __future__ import annotations

from django import db
from django.utils import timezone

import drumbeat

from .models import Signup

jobs = drumbeat.App()


@jobs.task(name="recipes.django.send_welcome", retries=3, timeout=30)
def send_welcome(signup_id: int) -> str:
    """Runs in the worker's thread pool, where no request cycle closes Django's connections."""
    try:
        signup = Signup.objects.get(pk=signup_id)
        # ... send the mail here ...
        signup.welcomed_at = timezone.now()
        signup.save(update_fields=["welcomed_at"])
        return str(signup.email)
    finally:
        db.close_old_connections()
