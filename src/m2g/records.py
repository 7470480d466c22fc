"""The decision log's tables (``m2g run --decision-log``, ``m2g report``): their Arrow schemas,
shared by the writer (m2g_controllers.decisionlog) and the reader (m2g_cli.report_cmd). The
meaning of every column: docs/decision-log.md. Extend by adding columns, never by changing one.
"""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")
DECISIONS = pa.schema([
    ("time", TS), ("stage", pa.string()), ("kind", pa.string()), ("target", pa.string()),
    ("outcome", pa.string()), ("policy", pa.string()), ("rule", pa.string()),
    ("message", pa.string()), ("value", pa.float64()), ("applied", pa.bool_()),
    ("policy_set", pa.string()),
    ("site_draw_kw", pa.float64()), ("site_limit_kw", pa.float64()),
    ("power_age_s", pa.float64()), ("grid_event", pa.string()), ("grid_level", pa.int32()),
    ("grid_target_kw", pa.float64()), ("grid_baseline_kw", pa.float64()),
    ("grid_event_start", TS), ("grid_event_end", TS),
    ("flex_tier", pa.int32()), ("gpus", pa.int32()), ("estimated_kw", pa.float64()),
    ("checkpoint_age_s", pa.int64()),
])
LIFECYCLE = pa.schema([
    ("time", TS), ("workload", pa.string()), ("event", pa.string()),
    ("cluster_queue", pa.string()), ("flex_tier", pa.int32()), ("gpus", pa.int32()),
    ("estimated_kw", pa.float64()), ("nodes", pa.string()), ("racks", pa.string()),
    ("gpu_seconds", pa.float64()), ("kwh", pa.float64()), ("message", pa.string()),
])
