"""Where the shipped workload templates and example policies are.

In a checkout (an editable install) they are the repository's ``templates/`` and ``policies/``;
in an installed wheel they are package data under ``m2g/_shipped/`` (copied there by the build
hook in setup.py). Both answers are plain folders, so callers read them like any other.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES = "templates"
POLICIES = "policies"

_PACKAGE = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """The folder of shipped ``templates`` or ``policies``: the checkout's when this module runs
    from one, else the package data's. The path may not exist (a broken install); callers say so."""
    if name not in (TEMPLATES, POLICIES):
        raise ValueError(f"nothing shipped under {name!r}")
    checkout = _PACKAGE.parents[1] / name
    if (_PACKAGE.parents[1] / "pyproject.toml").is_file() and checkout.is_dir():
        return checkout
    return _PACKAGE / "_shipped" / name
