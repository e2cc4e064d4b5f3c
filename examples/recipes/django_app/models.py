from __future__ import annotations

from django.db import models


class Signup(models.Model):
    email = models.EmailField(unique=True)
    welcomed_at = models.DateTimeField(null=True)
