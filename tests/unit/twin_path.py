"""Where the twin's shipped data lives (bench/ is put on sys.path by tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"
