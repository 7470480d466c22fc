"""The batch's class keys worked out in C (m2g.policy.batch.decoding ``_keys_of``,
``_numbered``, 2026-12-03) are those of the per-value loops they replaced, on columns that mix
the values CEL tells apart and Python does not (1, 1.0, True; None; flat CelModels)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from m2g.model.inputs import Checkpoint, PowerCap
from m2g.policy.batch.decoding import _SCALARS, _key, _keys_of, _numbered


def _keys_before(values: list[Any]) -> list[Any]:
    return [v if (t := type(v)) is int or t is str else (t, v) if t in _SCALARS else _key(v)
            for v in values]


def _numbered_before(keys: Sequence[Any], most: int | None = None
                     ) -> tuple[list[int], list[int]] | None:
    index: dict[Any, int] = {}
    firsts: list[int] = []
    of: list[int] = []
    bound = len(keys) if most is None else most
    for pos, k in enumerate(keys):
        number = index.get(k)
        if number is None:
            if len(firsts) >= bound:
                return None
            number = index[k] = len(firsts)
            firsts.append(pos)
        of.append(number)
    return firsts, of


POOLS: dict[str, list[Any]] = {
    "ints": [0, 1, 2, 3, 7],
    "ints and strs": [1, 2, "1", "2", ""],
    "floats": [0.0, 1.0, 2.5, 1.0],
    "bools": [True, False],
    "mixed scalars": [1, 1.0, True, 0, 0.0, False, None, "1", ""],
    "floats and bools": [1.0, True, 0.0, False, None],
    "models": [Checkpoint(), Checkpoint(interval_seconds=60), PowerCap(), 1, None],
    "checkpoints": [Checkpoint(interval_seconds=i, last_age_seconds=a, reported=r)
                    for i in (0, 600) for a in (0, 5, 7) for r in (False, True)],
    # a field holding another type than its siblings' (model_construct skips validation):
    # keyed per value, the type kept apart
    "checkpoints of mixed field types": [
        Checkpoint(last_age_seconds=1), Checkpoint(last_age_seconds=1, reported=True),
        Checkpoint.model_construct(interval_seconds=0, last_age_seconds=True, reported=False),
        Checkpoint.model_construct(interval_seconds=0.0, last_age_seconds=1, reported=False)],
}


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_keys_and_numbers_are_those_of_the_loops(pool: str) -> None:
    rng = random.Random(pool)
    for n in (0, 1, 2, 5, 40, 300):
        values = [rng.choice(POOLS[pool]) for _ in range(n)]
        keys = _keys_of(list(values))
        assert keys == _keys_before(values)
        for most in (None, 0, 1, 2, 3, 5, 100):
            assert _numbered(keys, most) == _numbered_before(keys, most), (n, most)
        pairs = list(zip(keys, reversed(keys), strict=True))  # tuple keys, as _keys zips them
        assert _numbered(pairs) == _numbered_before(pairs)


def test_values_cel_tells_apart_are_classes_apart() -> None:
    keys = _keys_of([1, 1.0, True, 1, True])
    assert _numbered(keys) == ([0, 1, 2], [0, 1, 2, 0, 2])
