"""The names drumbeat lets into the Redis key schema (namespaces, queues, task names, dedup keys,
job ids...), checked once where they come in: `check_name`.

They end up inside keys, hash fields and the ``|``-separated job state that Lua parses, so they
may not contain braces (hash tags), whitespace, ``|`` or other control characters.
"""

from __future__ import annotations

import re

__all__ = ["MAX_NAME_LENGTH", "check_name"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@/+=-]*")
# Task names default to `module.qualname`, which holds `<locals>` for nested functions.
_TASK_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@/+=<>-]*")
MAX_NAME_LENGTH = 200


def check_name(value: str, what: str) -> str:
    """Return ``value`` if it is safe inside the key schema, else raise ``ValueError``."""
    pattern = _TASK_NAME if what == "task name" else _NAME
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{what} is {len(value)} characters long; at most {MAX_NAME_LENGTH} are allowed"
        )
    if not pattern.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} has characters that would break the Redis key schema; use letters, "
            "digits and _ . : @ / + = - (starting with a letter or digit)"
        )
    return value
