"""The machine a figure was measured on: every bench names its CPU with each figure (hosts of
the same size differ: AMD EPYC and Intel Xeon both occur)."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """The CPU's model, as /proc/cpuinfo names it (the platform's processor elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
