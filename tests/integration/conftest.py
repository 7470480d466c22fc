"""Fixtures for tests against real local services that need no cluster (e.g. Prometheus).

These tests carry no marker: they run with the unit tests (``make test-unit``) because they start
in about a second. When Debian's ``prometheus`` is not installed they skip with that reason on a
developer machine, and *fail* under CI (``CI`` set), where a skip would hide a missing install.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus import PrometheusUnavailable
from prometheus.h200 import Phase, Row, backfill, data_dir, read_phases, read_rows
from prometheus.server import PrometheusServer, binary

REPO = Path(__file__).resolve().parents[2]


def _need(what: str, reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what}: {reason}", pytrace=False)
    pytest.skip(f"{what}: {reason}")


@pytest.fixture(scope="session")
def h200_data() -> tuple[list[Row], list[Phase]]:
    folder = data_dir()
    if not (folder / "telemetry.csv").exists():
        _need("H200 telemetry", f"{folder} not found: the repository's data/ is incomplete")
    return read_rows(folder / "telemetry.csv"), read_phases(folder / "load-phases.json")


@pytest.fixture(scope="session")
def h200_prometheus(tmp_path_factory: pytest.TempPathFactory,
                    h200_data: tuple[list[Row], list[Phase]]) -> Iterator[PrometheusServer]:
    """A real Prometheus whose TSDB holds the H200 recording under DCGM names."""
    try:
        binary("prometheus")
        binary("promtool")
    except PrometheusUnavailable as exc:
        _need("Prometheus", str(exc))
    work = tmp_path_factory.mktemp("prom-h200")
    backfill(h200_data[0], work, work / "tsdb")
    with PrometheusServer(work) as server:
        yield server
