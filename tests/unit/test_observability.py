"""Observability of ``m2g run`` (issue 11): its log is one JSON object per line with
tracebacks kept (the formatter dropped them, so ``log.exception`` said only its message), and
its metrics include build and process ones."""

from __future__ import annotations

import json
import logging

from m2g_controllers.run import JsonFormatter


def _record(exc: bool) -> logging.LogRecord:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        info = sys.exc_info() if exc else None
    return logging.LogRecord("m2g.x", logging.ERROR, __file__, 1, "reconcile failed: %s",
                             ("x",), info)


def test_a_traceback_is_one_json_string() -> None:
    line = JsonFormatter().format(_record(exc=True))
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["msg"] == "reconcile failed: x" and doc["level"] == "error"
    assert doc["exc"].startswith("Traceback") and "ValueError: boom" in doc["exc"]


def test_a_record_without_one_has_no_exc() -> None:
    assert "exc" not in json.loads(JsonFormatter().format(_record(exc=False)))


def test_build_info_and_process_metrics() -> None:
    import m2g
    from m2g_controllers.metrics import Metrics

    m = Metrics()
    names = {s.name: s for fam in m.registry.collect() for s in fam.samples}
    assert names["m2g_build_info"].labels["version"] == m2g.__version__
    assert names["m2g_build_info"].value == 1
    assert "process_resident_memory_bytes" in names and "process_cpu_seconds_total" in names
