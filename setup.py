"""Build hook: ship the repository's ``templates/`` and ``policies/`` inside the wheel.

They stay where people edit them (the repository root); a regular (non-editable) build copies
their YAML files into the package as ``m2g/_shipped/templates`` and ``m2g/_shipped/policies``,
where ``m2g.shipped`` finds them in an installed wheel. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("templates", "policies")


class BuildPy(build_py):
    """build_py, then the shipped folders as package data of ``m2g``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's folders directly
        for name in SHIPPED:
            src = ROOT / name
            dest = Path(self.build_lib) / "m2g" / "_shipped" / name
            shutil.rmtree(dest, ignore_errors=True)
            for path in sorted(src.rglob("*.yaml")):
                target = dest / path.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)


setup(cmdclass={"build_py": BuildPy})
