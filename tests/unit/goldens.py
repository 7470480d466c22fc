"""Golden-file comparison for CLI output: ``M2G_UPDATE_GOLDEN=1 pytest`` rewrites the files."""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("M2G_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with M2G_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs; M2G_UPDATE_GOLDEN=1 to accept"
