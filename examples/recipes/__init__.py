"""Framework recipes (docs/recipes.md): drumbeat in FastAPI, Django and a plain script, each run
by a test in tests/recipes/."""
