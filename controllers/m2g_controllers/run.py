"""``m2g run``: the controller process (leader election, caches, the loop, /metrics, /readyz).

    python -m m2g_controllers.run [--config FILE] [--kubeconfig K] [--context C] [--shadow]
        [--policies DIR] [--prometheus URL] [--leader-elect [--lease-namespace NS]]
        [--metrics-port 8080] [--clock-start 2026-11-29T03:00:00Z]

The site configuration (``--config``, docs/configuration.md) says where Prometheus is and how to
authenticate, which PromQL gives each signal, the planner's settings and the Lease.

Logs are JSON lines on stderr. SIGTERM/SIGINT stop the loop, release the Lease and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from m2g.config import SiteConfig, SiteConfigError, load_site_config
from m2g.config.site import DNS_LABEL, DNS_SUBDOMAIN
from m2g.k8s import client as k
from m2g.k8s.leader import LeaderElector
from m2g.planner.config import PlannerConfig
from m2g.policy import EngineUnavailable, make_runtime
from m2g.signals.config import PrometheusSettings, SignalConfig
from m2g.signals.http import PrometheusSetupError, make_http_client
from m2g_controllers import webhook
from m2g_controllers.health import HealthServer
from m2g_controllers.manager import UNREADY_STALE_SECONDS, Clock, Manager, clock_from, utcnow
from m2g_controllers.metrics import Metrics
from m2g_controllers.policies import PolicyStore
from m2g_controllers.wiring import K8sCluster

log = logging.getLogger("m2g")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and ``exc`` (the traceback, one JSON
    string) when the record has one — it was dropped, so ``log.exception`` said only its
    message (issue 11)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
               "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="m2g run", description=__doc__.splitlines()[0],
        epilog="A flag given on the command line overrides the same setting of --config.")
    p.add_argument("--config", type=Path, default=os.environ.get("M2G_CONFIG"),
                   help="site configuration YAML: Prometheus and its auth, the PromQL of each "
                        "signal, planner settings, the Lease (docs/configuration.md; "
                        "env M2G_CONFIG)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then "
                   "$KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context to use")
    p.add_argument("--shadow", action="store_true", help="decide and record, write nothing")
    p.add_argument("--levers", choices=("all", "pause"), default=None,
                   help="power levers under a shortfall: all (GPU power caps first, then "
                        "pauses; the default) or pause (pauses only); overrides "
                        "planner.powerCaps of --config (docs/curtailment.md)")
    p.add_argument("--policies", type=_policy_path,
                   help="policy folder (default: the cluster's Policy objects)")
    p.add_argument("--prometheus", default=os.environ.get("M2G_PROMETHEUS_URL"),
                   help="Prometheus URL for power, thermal and XID signals (overrides "
                        "prometheus.url of --config; env M2G_PROMETHEUS_URL)")
    p.add_argument("--leader-elect", action="store_true",
                   help="campaign for a Lease; only the leader writes")
    p.add_argument("--lease-namespace", type=_k8s_name(DNS_LABEL, 63),
                   help="namespace of the Lease (default: leaderElection.leaseNamespace, "
                        "else $POD_NAMESPACE, else m2g-system)")
    p.add_argument("--lease-name", type=_k8s_name(DNS_SUBDOMAIN, 253),
                   help="name of the Lease (default: m2g-controller)")
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname(),
                   help="this replica's name in the Lease (default: $POD_NAME or the host name)")
    p.add_argument("--metrics-port", type=_port, default=8080,
                   help="port of /metrics, /healthz and /readyz (0: any free port)")
    p.add_argument("--metrics-host", default="0.0.0.0", help="address to serve them on")
    p.add_argument("--webhook-port", type=_port, default=None,
                   help="serve the validating admission webhook of Policy and TenantPolicy "
                        "objects (m2g's policy compiler, POST /validate-policy, HTTPS) on this "
                        "port (0: any free port; default: not served; docs/deploy.md)")
    p.add_argument("--webhook-host", default="0.0.0.0", help="address to serve it on")
    p.add_argument("--webhook-cert-dir", type=Path, default=Path(WEBHOOK_CERT_DIR),
                   help="folder of the webhook's serving pair tls.crt and tls.key (a "
                        "kubernetes.io/tls Secret; read again when they change; default "
                        f"{WEBHOOK_CERT_DIR})")
    p.add_argument("--webhook-timeout", type=_webhook_timeout,
                   default=webhook.COMPILE_TIMEOUT_SECONDS, metavar="SECONDS",
                   help="compile bound of one object: past it the compiler is killed and the "
                        f"object refused (default {webhook.COMPILE_TIMEOUT_SECONDS:g}; keep it "
                        "below the ValidatingWebhookConfiguration's timeoutSeconds)")
    p.add_argument("--resync-seconds", type=_resync, default=10.0,
                   help="reconcile at least this often, changes or not")
    p.add_argument("--min-reconcile-interval", type=_interval, default=MIN_RECONCILE_INTERVAL,
                   metavar="SECONDS",
                   help="start a reconcile at most this often (changes meanwhile coalesce "
                        f"into the next; 0: at once; default {MIN_RECONCILE_INTERVAL})")
    p.add_argument("--quiet-reconcile-interval", type=_interval,
                   default=QUIET_RECONCILE_INTERVAL, metavar="SECONDS",
                   help="while no grid event is near and m2g curtails, defers and holds "
                        "nothing, a change of a pod or of a Workload that awaits no admission "
                        "check starts a reconcile at most this long after it, not at once (0: "
                        f"at once; default {QUIET_RECONCILE_INTERVAL:g})")
    p.add_argument("--check-name", type=_k8s_name(DNS_SUBDOMAIN, 253),
                   help="the AdmissionCheck m2g creates and keeps Active (default: "
                        "admissionChecks.name, m2g-policy); every check with controllerName "
                        "m2g.io/policy is answered")
    p.add_argument("--engine", choices=["cel-expr-python", "cel-python"],
                   help="CEL runtime (default: cel-expr-python, else cel-python)")
    p.add_argument("--log-level", default="info", type=str.lower,
                   choices=("debug", "info", "warning", "error"),
                   help="debug, info, warning or error")
    p.add_argument("--clock-start", type=_utc_time, metavar="TIME",
                   help="for tests and replays: the controller's clock starts at this RFC 3339 "
                        "time (with a zone, e.g. 2026-11-29T03:00:00Z) and advances with real "
                        "time; policies reading `now` see it (default: the wall clock)")
    p.add_argument("--decision-log", type=_log_dir, metavar="DIR",
                   help="write every decision and workload lifecycle record to DIR as Parquet "
                        "and CSV (decisions.*, lifecycle.*; schema: docs/decision-log.md); "
                        "the leader writes; summarise with `m2g report DIR`")
    return p.parse_args(argv)


def _utc_time(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an RFC 3339 time: {text!r}") from None
    if at.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone (add Z for UTC)")
    at = at.astimezone(UTC)
    if not 1970 <= at.year < 2200:  # as the CRDs bound times: later ones overflow timedeltas
        raise argparse.ArgumentTypeError(f"{text!r} is outside 1970-2200")
    return at


# Options checked before anything starts (each an argparse error: one usage line, exit 2);
# before, a negative, NaN or infinite resync, a port over 65535, an unknown log level (a
# traceback), a name the API server refuses or a missing policy folder were found only after
# connecting, or never.


def _seconds(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a number of seconds from ``low`` to ``high`` (NaN refused)."""
    def parse_seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not low <= value <= high:  # NaN fails both comparisons
            raise argparse.ArgumentTypeError(f"{text!r}: seconds between {low:g} and {high:g}")
        return value
    return parse_seconds


_resync = _seconds(0.1, 86400)
_webhook_timeout = _seconds(0.1, 29)
#: Where the Deployment mounts the webhook's Secret.
WEBHOOK_CERT_DIR = "/var/run/m2g/webhook"
#: seconds from one reconcile's start to the next one's at the least (docs/controllers.md)
MIN_RECONCILE_INTERVAL = 0.25
#: the same while quiet, for changes that decide nothing then (docs/controllers.md "Pacing")
QUIET_RECONCILE_INTERVAL = 2.0
_interval = _seconds(0, 60)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is 0-65535")
    return value


def _k8s_name(pattern: str, limit: int) -> Callable[[str], str]:
    def check(text: str) -> str:
        if len(text) > limit or re.fullmatch(pattern, text) is None:
            raise argparse.ArgumentTypeError(f"{text[:80]!r} is not a Kubernetes name "
                                             "(lowercase letters, digits, '-')")
        return text
    return check


def _policy_path(text: str) -> Path:
    path = Path(text)
    if not (path.is_dir() or path.is_file()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder or a file of policies")
    return path


def _log_dir(text: str) -> Path:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    return path


def make_clock(args: argparse.Namespace) -> Clock:
    """The controller's clock: the wall clock, or ``--clock-start`` advancing from its start."""
    return utcnow if args.clock_start is None else clock_from(args.clock_start)


@dataclass(frozen=True)
class Settings:
    """The command line and the site configuration resolved into what ``serve`` needs."""

    site: SiteConfig
    prometheus: PrometheusSettings | None
    lease_namespace: str
    lease_name: str


def resolve(args: argparse.Namespace, environ: dict[str, str]) -> Settings:
    """Flags over the file over the environment over the defaults; raises SiteConfigError."""
    site = load_site_config(args.config) if args.config else SiteConfig()
    prom = site.prometheus
    if args.prometheus:
        prom = (prom or PrometheusSettings()).model_copy(update={"url": args.prometheus})
        PrometheusSettings.model_validate(prom.model_dump())  # the flag's URL checked too
    return Settings(site, prom, args.lease_namespace or site.lease_namespace(environ),
                    args.lease_name or site.leader_election.lease_name)


def signal_config(settings: Settings) -> SignalConfig:
    """What K8sCluster reads the signals with: the site's signals, and the Prometheus
    settings in force (the file's, with --prometheus's URL): URL, timeout, answer bounds."""
    signals = settings.site.signal_config()
    prom = settings.prometheus
    if prom is None:
        return signals
    return signals.model_copy(update={"url": prom.url, "timeout_seconds": prom.timeout_seconds,
                                      "max_response_bytes": prom.max_response_bytes,
                                      "max_series": prom.max_series,
                                      "max_values_per_series": prom.max_values_per_series,
                                      "max_values": prom.max_values})


async def kick_on_leadership(elector: LeaderElector, manager: Manager,
                             stop: asyncio.Event) -> None:
    """Reconcile at once when this replica becomes the leader (not at the next resync)."""
    while not stop.is_set():
        await elector.leading.wait()
        manager.kick()
        while elector.is_leader and not stop.is_set():
            await asyncio.sleep(0.5)


async def start_webhook(args: argparse.Namespace, tls: webhook.TlsFiles | None,
                        metrics: Metrics
                        ) -> tuple[webhook.WebhookServer, webhook.CompileWorker] | None:
    """The Policy webhook when ``--webhook-port`` is given: the compiler's child process
    started, then the port."""
    if args.webhook_port is None or tls is None:
        return None
    worker = webhook.CompileWorker(args.engine, args.webhook_timeout)
    await worker.start()
    server = webhook.WebhookServer(
        worker.problems, tls.context, args.webhook_host, args.webhook_port,
        count=lambda outcome: metrics.webhook_reviews.labels(outcome).inc())
    await server.start()
    log.info("serving the Policy webhook (POST %s, HTTPS) on %s:%d", webhook.PATH,
             args.webhook_host, server.port)
    return server, worker


async def serve(args: argparse.Namespace, settings: Settings, stop: asyncio.Event) -> int:
    prom = settings.prometheus
    # the webhook's serving pair first: unreadable, m2g run ends with one line at once
    tls = webhook.TlsFiles(args.webhook_cert_dir) if args.webhook_port is not None else None
    http = make_http_client(prom) if prom is not None else None  # token file checked here
    if prom is not None and prom.insecure_skip_verify:
        log.warning("TLS verification of %s is off (prometheus.insecureSkipVerify)",
                    prom.where())
    kube = await k.connect(args.kubeconfig, args.context)
    signals = signal_config(settings)
    clock = make_clock(args)
    metrics = Metrics()
    cluster = K8sCluster(kube, prometheus=prom.url if prom else None, signal_config=signals,
                         http=http, instance=args.identity, clock=clock,
                         topology_labels=settings.site.topology.labels, metrics=metrics)
    elector = LeaderElector(kube, settings.lease_name, settings.lease_namespace,
                            args.identity) if args.leader_elect else None
    checks = settings.site.admission_checks
    planner = settings.site.planner_config(PlannerConfig(
        check_name=args.check_name or checks.name))
    if args.levers is not None:
        planner = dataclasses.replace(planner, power_caps=args.levers == "all")
    cluster.draw_history.keep_seconds = planner.draw_history_seconds
    cluster.elastic_placements = planner.nvlink_preplace
    decision_log = None
    if args.decision_log:  # pyarrow: ~40 MiB of the controller's RSS, only when asked for
        from m2g_controllers.decisionlog import DecisionLog
        decision_log = DecisionLog(args.decision_log, kw_per_gpu=planner.default_kw_per_gpu)
    manager = Manager(cluster, PolicyStore(make_runtime(args.engine)), metrics,
                      config=planner, shadow=args.shadow, check_configs=checks.configs,
                      is_leader=(lambda: elector.is_leader) if elector else (lambda: True),
                      resync_seconds=args.resync_seconds, policy_dir=args.policies,
                      clock=clock, decision_log=decision_log,
                      unready_stale_seconds=UNREADY_STALE_SECONDS if prom is not None else None,
                      freeze_collector=True, min_interval_seconds=args.min_reconcile_interval,
                      quiet_interval_seconds=args.quiet_reconcile_interval)
    health = HealthServer(metrics.registry, manager.ready, args.metrics_host, args.metrics_port)
    await health.start()
    log.info("serving /metrics /healthz /readyz on %s:%d", args.metrics_host, health.port)
    hook = await start_webhook(args, tls, metrics)
    tasks = []
    try:
        await cluster.start(manager.changed)
        log.info("caches synced; shadow=%s leader-elect=%s", args.shadow, bool(elector))
        if elector is not None:
            tasks.append(asyncio.create_task(elector.run(stop)))
            tasks.append(asyncio.create_task(kick_on_leadership(elector, manager, stop)))
        manager.kick()
        await manager.run(stop)
    finally:
        for t in tasks:
            t.cancel()
        if elector is not None and elector.is_leader:
            await elector.release()
        await cluster.stop()
        await health.stop()
        if hook is not None:
            await hook[0].stop()
            hook[1].stop()
        await kube.close()
        if manager.decision_log is not None:
            manager.decision_log.close()  # the Parquet footers
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    for chatty in ("httpx", "httpcore", "kr8s"):  # one line per HTTP request buries decisions
        logging.getLogger(chatty).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="Kubernetes version .* is not supported")

    async def go() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await serve(args, settings, stop)

    try:
        settings = resolve(args, dict(os.environ))
        if settings.prometheus is not None:
            log.info("signals from %s", settings.prometheus.where())
        return asyncio.run(go())
    except SiteConfigError as exc:
        for line in exc.problems:
            print(f"error: m2g run: {line}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # --prometheus with an unusable URL
        print(f"error: m2g run: --prometheus: {exc.errors()[0]['msg']}", file=sys.stderr)
        return 2
    except (k.KubeError, EngineUnavailable, OSError, TimeoutError,
            PrometheusSetupError, webhook.CompileTimeout) as exc:
        print(f"error: m2g run: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
