"""``python kind-e2e/prometheus serve|h200`` — a local Prometheus for the demo and by hand.

serve --workdir DIR [--port 9090] [--sim-target 127.0.0.1:9400 ...] [--scrape-interval 5s]
    run prometheus in the foreground (Ctrl-C stops it), scraping the simulator(s);
h200 OUT_DIR
    backfill the H200 recording into OUT_DIR/tsdb (then ``serve --workdir OUT_DIR``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a folder: make kind-e2e/ importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus import PrometheusFailed, PrometheusUnavailable
from prometheus.h200 import backfill, data_dir, read_rows
from prometheus.server import PrometheusServer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="prometheus")
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--workdir", type=Path, required=True)
    serve.add_argument("--port", type=int, default=9090)
    serve.add_argument("--sim-target", action="append", default=[])
    serve.add_argument("--scrape-interval", default="5s")
    h200 = sub.add_parser("h200")
    h200.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops prometheus too
    try:
        if args.cmd == "h200":
            rows = read_rows(data_dir() / "telemetry.csv")
            args.out.mkdir(parents=True, exist_ok=True)
            backfill(rows, args.out, args.out / "tsdb")
            print(f"{len(rows)} H200 readings → {args.out / 'tsdb'}")
            return 0
        with PrometheusServer(args.workdir, args.sim_target, args.port,
                              args.scrape_interval) as server:
            print(f"prometheus on {server.url} (data {server.tsdb}); Ctrl-C stops it")
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(1)
            print(f"prometheus exited; see {server.log}", file=sys.stderr)
            return 1
    except (PrometheusUnavailable, PrometheusFailed, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
