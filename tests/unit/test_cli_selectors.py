"""kubectl-style label selectors (m2g_cli.selectors)."""

from __future__ import annotations

import pytest

from m2g_cli.selectors import SelectorError, parse_selector

LABELS = {"app": "train", "tier": "2", "m2g.io/workload-kind": "training"}


@pytest.mark.parametrize(("selector", "matches"), [
    ("", True), ("app=train", True), ("app==train", True), ("app!=train", False),
    ("app=serve", False), ("app", True), ("!app", False), ("!missing", True),
    ("tier in (1,2)", True), ("tier notin (1, 2)", False), ("tier in (3)", False),
    ("app=train,tier in (2,3)", True), ("app=train,tier=3", False),
    ("m2g.io/workload-kind=training", True), ("missing!=x", True),
])
def test_selector_matches_like_kubectl(selector: str, matches: bool) -> None:
    assert parse_selector(selector)(LABELS) is matches


@pytest.mark.parametrize("bad", ["app=(x", "tier in (1,2", "a b c", "=x"])
def test_unreadable_selector_is_one_error(bad: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(bad)
