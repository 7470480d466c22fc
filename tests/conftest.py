"""Shared pytest configuration."""

from __future__ import annotations

import sys
from pathlib import Path

# The twin (bench/twin.py) keeps its modules in bench/twinkit: a bench, not a package.
_BENCH = str(Path(__file__).resolve().parents[1] / "bench")
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
