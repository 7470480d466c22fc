"""``_facts`` keeps its memo (key → (resourceVersion, conversion)) up to date in place
(2026-12-06: the 160,000 entries of pods and workloads were rebuilt every snapshot): after
every call of a random sequence — objects changed, gone, new, read without a
resourceVersion and with one again, a conversion that raises — the memo holds exactly the
objects with a resourceVersion, each with the conversion of that version; a hit is the kept
object itself; and a call that raises leaves the memo as it was."""

from __future__ import annotations

import random
from typing import Any

import pytest

from m2g.k8s import build as kb


def _convert(o: dict[str, Any]) -> tuple[str, int]:
    if o.get("bad"):
        raise ValueError("cannot read it")
    return ("c", o["v"])


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("keep_equal", [False, True])
def test_the_memo_is_the_versioned_objects_after_every_call(seed: int, keep_equal: bool) -> None:
    rng = random.Random(seed)
    objs: dict[str, dict[str, Any]] = {}
    for i in range(rng.randrange(0, 40)):
        objs[f"k{i}"] = {"metadata": {"resourceVersion": "1"}, "v": i}
    kept: dict[str, tuple[str, Any]] = {}
    version = 1
    for _ in range(30):
        version += 1
        for key in rng.sample(sorted(objs), min(len(objs), rng.randrange(0, 6))):
            change = rng.choice((0, 1, 2, 4))
            if change == 0:
                del objs[key]
            elif change == 1:  # changed: a new version
                objs[key] = {"metadata": {"resourceVersion": str(version)}, "v": rng.randrange(9)}
            elif change == 2:  # read without a resourceVersion
                objs[key] = {"metadata": {}, "v": rng.randrange(9)}
            else:  # the same content under a new version (keep_equal keeps the object)
                objs[key] = {**objs[key], "metadata": {"resourceVersion": str(version)}}
        for i in range(rng.randrange(0, 4)):
            objs[f"n{version}-{i}"] = {"metadata": {"resourceVersion": str(version)}, "v": i}
        before = dict(kept)
        if rng.random() < 0.1 and objs:
            key = rng.choice(sorted(objs))
            objs[key] = {**objs[key], "bad": True, "metadata": {"resourceVersion": str(version)}}
            assert kb._facts(objs, _convert, kept, keep_equal) is None
            assert kept == before  # a call that raises leaves the memo as it was
            objs[key] = {**objs[key], "bad": False}
        got = kb._facts(objs, _convert, kept, keep_equal)
        assert got == [_convert(o) for o in objs.values()]
        versioned = {k: o["metadata"]["resourceVersion"] for k, o in objs.items()
                     if o["metadata"].get("resourceVersion")}
        assert {k: rv for k, (rv, _) in kept.items()} == versioned
        for (k, o), g in zip(objs.items(), got, strict=True):
            if k in kept:
                assert kept[k][1] is g and g == _convert(o)
            if k in before and k in kept and before[k][0] == kept[k][0]:
                assert kept[k][1] is before[k][1]  # a hit: the kept conversion itself


def test_an_object_read_without_a_version_is_dropped_from_the_memo() -> None:
    kept: dict[str, tuple[str, Any]] = {}
    kb._facts({"a": {"metadata": {"resourceVersion": "7"}, "v": 1}}, _convert, kept)
    kb._facts({"a": {"metadata": {}, "v": 2}}, _convert, kept)
    assert kept == {}
    got = kb._facts({"a": {"metadata": {"resourceVersion": "7"}, "v": 3}}, _convert, kept)
    assert got == [("c", 3)]  # the version seen before, but nothing kept for it: read again
