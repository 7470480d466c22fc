"""Parsing Kubernetes values (pure): quantities, RFC 3339 times, ISO 8601 durations.

Bad input never raises: an unreadable quantity is 0, an unreadable time or duration None.

Quantities follow Kubernetes' resource.Quantity: a decimal number (``4``, ``1.5``, ``-2``,
``1e3``) with an optional suffix — decimal SI ``n u m "" k M G T P E`` or binary
``Ki Mi Gi Ti Pi Ei``. As in Kubernetes, ``1E3`` is an exponent (1000) and ``1E`` the suffix
(10^18).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

_SUFFIX: dict[str, Decimal] = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60)}
_QTY = re.compile(r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
                  r"(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def quantity(value: Any) -> float:
    """A Kubernetes quantity ("4", "1.5", "100m", "500n", "2Ki", "1Pi", "1E") as a number;
    0 when unreadable."""
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else 0.0
    if isinstance(value, str) and value.isascii() and value.isdigit():  # "4", without Decimal
        number = float(value)  # 400 digits: inf
        return number if math.isfinite(number) else 0.0
    m = _QTY.match(str(value).strip())
    if not m:
        return 0.0
    try:
        number = float(Decimal(m.group(1)) * _SUFFIX[m.group(2) or ""])
    except ArithmeticError:  # InvalidOperation, and Overflow for "1e9999999"
        return 0.0
    return number if math.isfinite(number) else 0.0


#: The largest magnitude ``int_of`` returns (2**53, the last integer a float holds exactly): a
#: quantity of "1e308" GPUs became a 309-digit int whose product with a float raised
#: OverflowError out of the planner (every reconcile).
MAX_INT = 2**53


def int_of(value: Any, default: int = 0) -> int:
    """A quantity as an int (truncated, within ±``MAX_INT``); ``default`` when None."""
    number = quantity(value) if value is not None else float(default)
    if not math.isfinite(number):
        return default
    return int(max(-MAX_INT, min(MAX_INT, number)))


def nonneg_int(value: Any) -> int:
    return max(0, int_of(value))


def nonneg_float(value: Any) -> float:
    number = quantity(value) if value is not None else 0.0
    return number if number > 0 and math.isfinite(number) else 0.0


def parse_time(value: Any) -> datetime | None:
    """RFC 3339 ("2026-01-02T03:04:05Z", fractions, offsets) → aware datetime; None if bad."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def format_time(value: datetime) -> str:
    """RFC 3339 with second precision, UTC (what Kubernetes' metav1.Time accepts)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_DURATION = re.compile(r"^P(?:(\d+(?:\.\d+)?)W)?(?:(\d+(?:\.\d+)?)D)?"
                       r"(?:T(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def parse_duration(value: Any) -> timedelta | None:
    """An ISO 8601 duration (PT1H, P1DT30M, PT90S; no years/months) → timedelta; None if bad."""
    if not isinstance(value, str):
        return None
    m = _DURATION.match(value.strip())
    if not m or value.strip() in ("P", "PT"):
        return None
    w, d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    try:
        return timedelta(weeks=w, days=d, hours=h, minutes=mi, seconds=s)
    except OverflowError:  # beyond timedelta's 999,999,999 days
        return None
