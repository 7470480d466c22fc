"""Hypothesis profiles for the fuzz suites, and a count of the examples each one ran.

``make test`` runs them under the ``ci`` profile (a bounded number of examples, ~1-2 minutes in
all); ``make fuzz`` sets ``HYPOTHESIS_PROFILE=fuzz`` for many more. No deadline: the machine is
shared, and a slow example is not a failure (benchmarks measure speed). The counts are printed
at the end and written to ``$M2G_FUZZ_COUNTS`` when set (docs/reliability.md quotes them).
"""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import HealthCheck, settings

from tests.fuzz.helpers import COUNTS

settings.register_profile(
    "ci", max_examples=int(os.environ.get("M2G_FUZZ_EXAMPLES", "60")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True, database=None)
settings.register_profile(
    "fuzz", max_examples=int(os.environ.get("M2G_FUZZ_EXAMPLES", "2000")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not COUNTS:
        return
    total = sum(COUNTS.values())
    terminalreporter.write_line(f"fuzz: {total} examples over {len(COUNTS)} targets")
    for name, n in sorted(COUNTS.items()):
        terminalreporter.write_line(f"  {name}: {n}")
    path = os.environ.get("M2G_FUZZ_COUNTS")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(dict(sorted(COUNTS.items())), fh, indent=2)
