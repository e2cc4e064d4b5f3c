"""A plain script: enqueue a job and wait for its result, with no web framework and no asyncio.

    drumbeat worker examples.recipes.script:app     # a worker, in another terminal
    python -m examples.recipes.script 6 7           # prints "6 x 7 = 42"

Both read ``DRUMBEAT_REDIS_URL`` (with none, the embedded Redis of this machine).
"""

from __future__ import annotations

import sys

import drumbeat

app = drumbeat.App()


# An explicit name: run as a script this module is __main__, while the worker imports it as
# examples.recipes.script; a default name (module.function) would differ between the two.
@app.task(name="recipes.multiply", retries=2)
def multiply(a: int, b: int) -> int:
    return a * b


def main(argv: list[str]) -> int:
    a, b = (int(x) for x in argv) if argv else (6, 7)
    try:
        job = multiply.enqueue(a, b)
        product = job.result(timeout=30)  # blocks in Redis until a worker has run it
    except drumbeat.ResultTimeout:
        print(
            "no result within 30 s: is `drumbeat worker examples.recipes.script:app` running "
            "on the same Redis?",
            file=sys.stderr,
        )
        return 1
    finally:
        app.close()
    print(f"{a} x {b} = {product}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
