"""Where the twin's shipped data lives (bench/ is on the import path: pytest pythonpath, pyproject.toml)."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"
