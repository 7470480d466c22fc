"""Shared strategies of the fuzz suites and the per-target example count."""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Any

from hypothesis import strategies as st

#: examples run per fuzz target (tests.fuzz.conftest prints them)
COUNTS: Counter[str] = Counter()


def count() -> None:
    """Count one example for the calling test."""
    frame = inspect.stack()[1]
    COUNTS[frame.function.removeprefix("test_")] += 1


#: Numbers as hostile inputs carry them: NaN, ±Inf, huge, tiny, negative zero, big integers.
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -0.0, 1e300, -1e300, 1e-320, 2**63, -(2**63) - 1]))

SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20))


def json_values(keys: st.SearchStrategy[str] | None = None, leaves: int = 20
                ) -> st.SearchStrategy[Any]:
    """Nested JSON-like values; map keys drawn from ``keys`` (plus arbitrary text)."""
    key = st.one_of(keys, st.text(max_size=12)) if keys is not None else st.text(max_size=12)
    return st.recursive(
        SCALARS,
        lambda inner: st.one_of(st.lists(inner, max_size=4),
                                st.dictionaries(key, inner, max_size=5)),
        max_leaves=leaves)
