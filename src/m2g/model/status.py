"""Comparing the status fields one writer owns with what an object's status says.

An object's ``status.conditions`` is a list keyed by ``type`` that several field managers
share: the planner writes a GridEvent's ``Active`` and ``BaselineObserved``, the snapshot's
validity writer (m2g.k8s.validity) its ``Accepted``. A writer compares only its own condition
types, by type, so another writer's condition never makes it write again every reconcile.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def conditions_by_type(value: Any) -> dict[str, Mapping[str, Any]]:
    """``status.conditions`` as type → condition (anything malformed is ignored)."""
    if not isinstance(value, list):
        return {}
    return {str(c["type"]): c for c in value if isinstance(c, Mapping) and "type" in c}


def same_status(current: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Does ``current`` already say every field of ``want``? ``conditions`` are compared for
    the types ``want`` lists only (a condition another writer owns is not a difference)."""
    for key, value in want.items():
        if key == "conditions" and isinstance(value, list):
            have = conditions_by_type(current.get(key))
            if any(have.get(t) != c for t, c in conditions_by_type(value).items()):
                return False
        elif current.get(key) != value:
            return False
    return True
