"""``Sample``: one element of a Prometheus instant vector (labels, value, timestamp)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Sample:
    """Labels, value and timestamp (Unix seconds) of one series at one instant.

    ``timestamp`` is the time the value was scraped when the query is a plain selector read with
    ``PrometheusClient.query_with_age``; otherwise it is the evaluation time Prometheus reports.
    ``query_with_age`` makes it NaN when the scrape time is unknown (``timestamp()`` has no
    answer for the series, or one that is not finite or lies in the future): such a sample
    never reads as fresh (m2g.signals.readings makes it INVALID).
    """

    labels: Mapping[str, str]
    value: float
    timestamp: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    def identity(self) -> tuple[tuple[str, str], ...]:
        """The label set without ``__name__`` (what ``timestamp(...)`` keeps)."""
        return tuple(sorted((k, v) for k, v in self.labels.items() if k != "__name__"))
