from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from .models import Signup
from .tasks import send_welcome


def register(email: str) -> Signup:
    """Save a signup and enqueue its welcome once the transaction commits, never before: a
    worker could run a job enqueued earlier before the row is visible, and a signup that is
    rolled back (here or in a transaction around this one) must get no mail."""
    with transaction.atomic():
        signup = Signup.objects.create(email=email)
        transaction.on_commit(lambda: send_welcome.enqueue(signup.pk))
    return signup


@require_POST
def signup(request: HttpRequest) -> JsonResponse:
    created = register(request.POST["email"])
    return JsonResponse({"signup": created.pk}, status=202)
