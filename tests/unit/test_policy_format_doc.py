"""docs/policy-format.md (the policy contract as users read it) names every CEL input the engine
offers: a field added to m2g.model.inputs without a word in the contract fails here."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from m2g.model.inputs import PolicyInput

DOC = Path(__file__).resolve().parents[2] / "docs" / "policy-format.md"


def cel_names(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[str]:
    """The CEL (camelCase) name of every field of ``model`` and of the models it contains."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    out: set[str] = set()
    for name, field in model.model_fields.items():
        out.add(field.alias or name)
        for arg in _types(field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out |= cel_names(arg, seen)
    return out


def _types(annotation: object) -> list[object]:
    args = list(getattr(annotation, "__args__", ()) or ())
    return [annotation, *[t for a in args for t in _types(a)]]


def test_every_input_field_is_in_the_contract() -> None:
    text = DOC.read_text()
    words = set(re.findall(r"[A-Za-z]+", text))
    missing = sorted(n for n in cel_names(PolicyInput) if n not in words)
    assert not missing, f"docs/policy-format.md does not name: {missing}"
