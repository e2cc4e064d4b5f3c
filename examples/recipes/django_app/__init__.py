"""Django: enqueue a job only once the transaction that made its data commits
(``transaction.on_commit``), on SQLite. A Django app of its own (``django_app``) in a project of
one settings module:

    python -m examples.recipes.django_app.manage migrate
    python -m examples.recipes.django_app.manage runserver                   # the web app
    drumbeat worker examples.recipes.django_app.worker:jobs                  # a worker

Both read ``DRUMBEAT_REDIS_URL`` (with none, the embedded Redis of this machine).
"""
