"""Running relaxc's command line from the tests, as a user would (a fresh process each time)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def host_runs_avx2() -> bool:
    """Whether this CPU runs code built for ``znver3`` (AVX2 and FMA), such as the committed logs'."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags


def env() -> dict:
    """This environment with the repository importable."""
    return {**os.environ, "PYTHONPATH": ROOT}


def relaxc_command(*args) -> list[str]:
    return [sys.executable, "-m", "compiler", *(str(a) for a in args)]


def relaxc(*args, cwd=ROOT, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(relaxc_command(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env())
