"""Bring the local control plane up and down: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK, Kueue and the JobSet controller, in that order, each waited for; then the
CRDs, Kueue's and JobSet's webhooks and (optionally) a simulated factory."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from localcp import UserError, extras, factory, jobset, kueue, kwok, procs
from localcp.kube import Kube
from localcp.kubeconfig import write_kubeconfig
from localcp.paths import (
    BINARIES,
    MANIFESTS,
    TOOLS,
    RunPaths,
    binary,
    cache_dir,
    default_run_dir,
    read_versions,
    run_paths,
)
from localcp.pki import ensure_pki
from localcp.procs import Component

# start order; `down` stops in reverse
ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kueue",
         "jobset")
DEFAULT_PORTS = {
    "etcd": 2379, "etcd_peer": 2380, "apiserver": 6443, "controller_manager": 10257,
    "scheduler": 10259, "kwok": 10247, "kueue_webhook": 9443, "kueue_metrics": 8443,
    "kueue_health": 8081, "kueue_visibility": 8082,
    "jobset_webhook": 9444, "jobset_metrics": 8444, "jobset_health": 8083,
}
Log = Callable[[str], None]


# -- state ---------------------------------------------------------------------------------
def load_state(run: RunPaths) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(run.state.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data


def running(run: RunPaths) -> dict[str, int | None]:
    return {name: procs.read_pid(run, name) for name in ORDER}


def _kube(run: RunPaths, state: dict[str, Any]) -> Kube:
    return Kube(state["server"], run.pki)


# -- build ----------------------------------------------------------------------------------
def ensure_binaries(log: Log) -> None:
    """Build missing binaries (kind-e2e/tools/build.sh prints progress); no-op when warm."""
    missing = [b for b in BINARIES if not binary(b).exists()]
    if not missing:
        log(f"[build] all {len(BINARIES)} binaries cached under {binary('etcd').parent.parent}")
        return
    log(f"[up] building missing binaries: {' '.join(missing)} (cold build: see docs)")
    rc = subprocess.call(["bash", str(TOOLS / "build.sh"), *missing])
    if rc != 0:
        raise UserError(f"building {' '.join(missing)} failed (exit {rc}); see the output above")


# -- components -----------------------------------------------------------------------------
def _http_ok(url: str, verify: Any = False, body: str | None = None) -> bool:
    resp = httpx.get(url, verify=verify, timeout=2, trust_env=False)
    return resp.status_code == 200 and (body is None or body in resp.text)


def components(run: RunPaths, ports: dict[str, int]) -> dict[str, Component]:
    p, kc = run.pki, str(run.kubeconfig)
    server = f"https://127.0.0.1:{ports['apiserver']}"
    ctx = ssl.create_default_context(cafile=str(p / "ca.crt"))
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT | ssl.VERIFY_X509_PARTIAL_CHAIN
    ctx.load_cert_chain(str(p / "admin.crt"), str(p / "admin.key"))
    server_ctx = ssl.create_default_context(cafile=str(p / "serving-ca.crt"))  # our webhook
    server_ctx.verify_flags |= ssl.VERIFY_X509_STRICT | ssl.VERIFY_X509_PARTIAL_CHAIN
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
    delegated = [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
                 f"--authorization-kubeconfig={kc}", "--leader-elect=false",
                 "--bind-address=127.0.0.1"]
    return {
        "etcd": Component(
            "etcd",
            [str(binary("etcd")), "--name=m2g", f"--data-dir={run.etcd_data}",
             f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
             f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
             f"--initial-cluster=m2g={peer_url}", "--unsafe-no-fsync",
             "--max-request-bytes=10485760", "--quota-backend-bytes=8589934592",
             "--log-level=warn"],
            ready=lambda: _http_ok(f"{etcd_url}/health", body='"health":"true"'),
            timeout=30),
        "kube-apiserver": Component(
            "kube-apiserver",
            [str(binary("kube-apiserver")), f"--etcd-servers={etcd_url}",
             "--etcd-prefix=/registry", "--bind-address=127.0.0.1",
             "--advertise-address=127.0.0.1", f"--secure-port={ports['apiserver']}",
             f"--tls-cert-file={p / 'apiserver.crt'}",
             f"--tls-private-key-file={p / 'apiserver.key'}",
             f"--client-ca-file={p / 'ca.crt'}", f"--service-account-issuer={server}",
             f"--service-account-key-file={p / 'sa.pub'}",
             f"--service-account-signing-key-file={p / 'sa.key'}",
             "--service-cluster-ip-range=10.0.0.0/24", "--authorization-mode=RBAC",
             "--allow-privileged=true", "--endpoint-reconciler-type=none",
             "--max-requests-inflight=0", "--max-mutating-requests-inflight=0",
             "--enable-priority-and-fairness=false", "--profiling=false",
             # aggregation, for Kueue's visibility API (an APIService backed by 127.0.0.1)
             f"--requestheader-client-ca-file={p / 'ca.crt'}",
             "--requestheader-allowed-names=front-proxy-client",
             "--requestheader-username-headers=X-Remote-User",
             "--requestheader-group-headers=X-Remote-Group",
             "--requestheader-extra-headers-prefix=X-Remote-Extra-",
             f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
             f"--proxy-client-key-file={p / 'front-proxy-client.key'}", "--v=1"],
            ready=lambda: _http_ok(f"{server}/readyz", verify=ctx, body="ok"),
            timeout=60),
        "kube-controller-manager": Component(
            "kube-controller-manager",
            [str(binary("kube-controller-manager")), *delegated,
             f"--secure-port={ports['controller_manager']}",
             f"--service-account-private-key-file={p / 'sa.key'}",
             f"--root-ca-file={p / 'ca.crt'}",
             "--kube-api-qps=200", "--kube-api-burst=400",
             "--node-monitor-grace-period=180s", "--v=1"],
            ready=lambda: _http_ok(
                f"https://127.0.0.1:{ports['controller_manager']}/healthz", body="ok"),
            timeout=60),
        "kube-scheduler": Component(
            "kube-scheduler",
            [str(binary("kube-scheduler")), *delegated,
             f"--secure-port={ports['scheduler']}", "--v=1"],
            ready=lambda: _http_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz", body="ok"),
            timeout=60),
        "kwok": Component(
            "kwok",
            [str(binary("kwok")), f"--kubeconfig={kc}",
             f"--config={run.root / 'kwok.yaml'}", "--manage-all-nodes=false",
             f"--manage-nodes-with-annotation-selector={kwok.NODE_ANNOTATION}=fake",
             "--node-ip=127.0.0.1", "--node-name=kwok-controller",
             "--node-lease-duration-seconds=120",  # renewed every 30s: 60 writes/s at 1,800 nodes
             f"--server-address=127.0.0.1:{ports['kwok']}"],
            ready=lambda: _http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"),
            timeout=60),
        "kueue": Component(
            "kueue",
            [str(binary("kueue")), f"--config={run.root / 'kueue.yaml'}",
             f"--kubeconfig={kc}", f"--zap-log-level={kueue.log_level()}"],
            ready=lambda: (_http_ok(f"http://127.0.0.1:{ports['kueue_health']}/readyz")
                           and procs.tls_ok(ports["kueue_webhook"], server_ctx)),
            timeout=90),
        "jobset": Component(
            "jobset",
            jobset.command(binary("jobset"), str(run.root / "jobset.yaml"), run.kubeconfig),
            ready=lambda: (_http_ok(f"http://127.0.0.1:{ports['jobset_health']}/readyz")
                           and procs.tls_ok(ports["jobset_webhook"], server_ctx)),
            timeout=90),
    }


# -- up ---------------------------------------------------------------------------------------
def up(factory_spec: Path | None, log: Log = print,
       extra_crds: str | None = None) -> dict[str, Any]:
    """Start everything (building first if needed); a running control plane is reused.
    ``extra_crds``: see localcp.extras (default ``$M2G_EXTRA_CRDS``)."""
    t_start = time.monotonic()
    extra = extras.requested(extra_crds)
    run = run_paths()
    pids = running(run)
    state = load_state(run)
    if state and all(pids.values()):
        log(f"[up] already running (kubeconfig {run.kubeconfig})")
        if factory_spec is not None:
            _apply_factory(run, state, factory_spec, log)
        return state
    if any(pids.values()):
        log("[up] a partial control plane is running; stopping it first")
        down(log)

    ensure_binaries(log)
    run.root.mkdir(parents=True, exist_ok=True)
    for stale in (run.etcd_data, run.pids):
        shutil.rmtree(stale, ignore_errors=True)
    run.logs.mkdir(parents=True, exist_ok=True)
    for old in run.logs.glob("*.log"):
        old.unlink()

    taken: set[int] = set()
    ports: dict[str, int] = {}
    # The default run takes the well-known ports when free. Another run ($M2G_RUN: CI, the
    # twin, parallel sessions) takes ephemeral ones: two runs that start together would both
    # see a default port free and the later component to bind it would fail (or, worse, the
    # readiness probe would find the other run's component on it).
    defaults = run.root == default_run_dir()
    for key, preferred in DEFAULT_PORTS.items():
        ports[key] = procs.pick_port(preferred if defaults else 0, taken)
        taken.add(ports[key])
    server = f"https://127.0.0.1:{ports['apiserver']}"
    state = {"server": server, "ports": ports, "kubeconfig": str(run.kubeconfig),
             "extraCrds": extra,
             "versions": read_versions(), "started": time.time(), "factories": []}
    run.state.write_text(json.dumps(state, indent=2))

    ensure_pki(run.pki, cache_dir() / "pki-kueue-serving")
    write_kubeconfig(run.kubeconfig, run.pki, server)
    kueue.install_certs(run.pki, run.kueue_certs)
    kueue.config(run.root, run.kueue_certs, ports)
    jobset.install_certs(run.pki, run.jobset_certs)
    jobset.config(run.root, run.jobset_certs, ports)
    kwok.write_config(run.root / "kwok.yaml")
    comps = components(run, ports)
    timings: dict[str, float] = {}

    def start_and_wait(name: str) -> None:
        t0 = time.monotonic()
        procs.start(run, comps[name])
        procs.wait_ready(run, comps[name])
        timings[name] = time.monotonic() - t0
        log(f"[up] {name} ready ({timings[name]:.1f}s)")

    try:
        start_and_wait("etcd")
        start_and_wait("kube-apiserver")
        kube = _kube(run, state)
        _check_version(kube, read_versions()["KUBERNETES_VERSION"])
        procs.start(run, comps["kube-controller-manager"])
        procs.start(run, comps["kube-scheduler"])
        _install_crds(kube, log, extra)
        start_and_wait("kwok")
        start_and_wait("kueue")
        _register_webhooks(kube, run, ports, log)
        start_and_wait("jobset")
        _register_jobset_webhooks(kube, run, ports, log)
        _register_visibility(kube, run, ports, log)
        for name in ("kube-controller-manager", "kube-scheduler"):
            procs.wait_ready(run, comps[name])
        log("[up] kube-controller-manager, kube-scheduler ready")
        _check_all_alive(run)
        if factory_spec is not None:
            _apply_factory(run, state, factory_spec, log)
        _check_all_alive(run)
    except (UserError, httpx.HTTPError, OSError) as exc:
        log("[up] start-up failed; stopping what was started")
        down(lambda _msg: None)
        if isinstance(exc, UserError):
            raise
        raise UserError(f"start-up failed: {exc}") from exc
    state["upSeconds"] = round(time.monotonic() - t_start, 1)
    run.state.write_text(json.dumps(state, indent=2))
    log(f"[up] control plane up in {state['upSeconds']}s; API server {server}")
    log(f"[up] kubeconfig: {run.kubeconfig}")
    log(f"     export KUBECONFIG={run.kubeconfig}")
    return state


def _check_all_alive(run: RunPaths) -> None:
    """Every component still runs (one that lost a port race exits a moment after start)."""
    for name, pid in running(run).items():
        if pid is None:
            log = run.log(name)
            raise UserError(f"{name} exited after start-up; last lines of {log}:\n"
                            + procs.log_tail(log))


def _check_version(kube: Kube, want: str) -> None:
    got = (kube.get("/version") or {}).get("gitVersion")
    if got != want:
        raise UserError(f"kube-apiserver reports version {got!r}, expected {want!r} "
                        "(binary built without version ldflags? Kueue needs a semver)")


def _install_crds(kube: Kube, log: Log, extra: list[str]) -> None:
    t0 = time.monotonic()
    crds = kueue.crds() + jobset.crds() + [d for d in yaml.safe_load_all(
        (MANIFESTS / "kai-crds.yaml").read_text()) if d] + extras.crds(extra)
    # the JobSet CRD is always there (the controller runs); an extra set naming it again
    # (M2G_EXTRA_CRDS=all) must not apply it twice
    crds = list({str(crd["metadata"]["name"]): crd for crd in crds}.values())
    kube.apply({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": kueue.NAMESPACE}})
    kube.apply_many(crds, workers=4)
    names = [str(crd["metadata"]["name"]) for crd in crds]
    kube.wait_for(f"CRDs {', '.join(names)} to be Established",
                  lambda: all(kube.crd_established(n) for n in names), timeout=60)
    log(f"[up] {len(crds)} CRDs established ({time.monotonic() - t0:.1f}s)")


def _register_webhooks(kube: Kube, run: RunPaths, ports: dict[str, int], log: Log) -> None:
    hooks = kueue.webhook_configurations((run.pki / "serving-ca.crt").read_bytes(),
                                         ports["kueue_webhook"])
    for hook in hooks:
        kube.apply(hook)
    n = sum(len(h.get("webhooks", [])) for h in hooks)
    log(f"[up] {n} Kueue webhooks registered at https://127.0.0.1:{ports['kueue_webhook']}")


def _register_jobset_webhooks(kube: Kube, run: RunPaths, ports: dict[str, int],
                              log: Log) -> None:
    hooks = jobset.webhook_configurations((run.pki / "serving-ca.crt").read_bytes(),
                                          ports["jobset_webhook"])
    for hook in hooks:
        kube.apply(hook)
    n = sum(len(h.get("webhooks", [])) for h in hooks)
    log(f"[up] {n} JobSet webhooks registered at https://127.0.0.1:{ports['jobset_webhook']}")


def _register_visibility(kube: Kube, run: RunPaths, ports: dict[str, int], log: Log) -> None:
    """Serve Kueue's visibility API (pending workloads) through kube-apiserver: an
    ExternalName Service ``localhost`` plus an APIService. Not fatal if it stays unavailable."""
    for obj in kueue.visibility_objects((run.pki / "serving-ca.crt").read_bytes(),
                                        ports["kueue_visibility"]):
        kube.apply(obj)
    url = f"/apis/apiregistration.k8s.io/v1/apiservices/{kueue.VISIBILITY_APISERVICE}"

    def available() -> bool:
        conds = ((kube.get(url) or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Available" and c["status"] == "True" for c in conds)

    try:
        kube.wait_for("the visibility APIService", available, timeout=30)
        log(f"[up] Kueue visibility API served ({kueue.VISIBILITY_APISERVICE})")
    except UserError:
        conds = ((kube.get(url) or {}).get("status") or {}).get("conditions") or [{}]
        log(f"[up] warning: {kueue.VISIBILITY_APISERVICE} not available: "
            f"{conds[0].get('message', '?')}")


def _apply_factory(run: RunPaths, state: dict[str, Any], spec_path: Path, log: Log) -> None:
    spec = factory.load_spec(spec_path)
    kube = _kube(run, state)
    try:
        secs = factory.apply(kube, spec, log=log)
    finally:
        kube.close()
    log(f"[factory] {spec.name}: {spec.racks} racks, {spec.node_count} nodes, "
        f"{spec.gpu_count} GPUs Ready in {secs:.1f}s")
    if spec.name not in state["factories"]:
        state["factories"].append(spec.name)
        run.state.write_text(json.dumps(state, indent=2))


def apply_factory(spec_path: Path, log: Log = print) -> None:
    run = run_paths()
    state = load_state(run)
    if not state or not procs.read_pid(run, "kube-apiserver"):
        raise UserError("the control plane is not running; run `make up` first")
    _apply_factory(run, state, spec_path, log)


def ensure_extra_crds(extra_crds: str | None = None, log: Log = print) -> list[str]:
    """Install the extra CRD sets (localcp.extras; default ``$M2G_EXTRA_CRDS``) that the
    running control plane lacks (a reused one may have been started without them); returns
    the sets installed now."""
    run = run_paths()
    state = load_state(run)
    if not state or not procs.read_pid(run, "kube-apiserver"):
        raise UserError("the control plane is not running; run `make up` first")
    missing = [n for n in extras.requested(extra_crds) if n not in state.get("extraCrds", [])]
    if not missing:
        return []
    crds = extras.crds(missing)
    kube = _kube(run, state)
    try:
        kube.apply_many(crds, workers=4)
        names = [str(crd["metadata"]["name"]) for crd in crds]
        kube.wait_for(f"CRDs {', '.join(names)} to be Established",
                      lambda: all(kube.crd_established(n) for n in names), timeout=60)
    finally:
        kube.close()
    state["extraCrds"] = [*state.get("extraCrds", []), *missing]
    run.state.write_text(json.dumps(state, indent=2))
    log(f"[up] extra CRDs {', '.join(missing)}: {len(crds)} established")
    return missing


# -- down --------------------------------------------------------------------------------------
def down(log: Log = print) -> None:
    """Delete Kueue's and JobSet's webhook configurations, then stop every component in
    reverse order."""
    run = run_paths()
    state = load_state(run)
    pids = running(run)
    if state and pids.get("kube-apiserver"):
        try:
            kube = _kube(run, state)
            kueue.delete_webhooks(kube)
            jobset.delete_webhooks(kube)
            kube.close()
        except (httpx.HTTPError, UserError, OSError) as exc:
            log(f"[down] could not delete the webhook configurations: {exc}")
    stopped = [name for name in reversed(ORDER) if procs.stop(run, name)]
    left = [name for name, pid in running(run).items() if pid]
    if left:
        raise UserError(f"still running after down: {', '.join(left)}")
    log(f"[down] stopped {', '.join(stopped) if stopped else 'nothing (was not running)'}")


# -- status -------------------------------------------------------------------------------------
def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def status(log: Log = print) -> bool:
    """Print each component's pid, RSS and log, plus the API server's view; True if all up."""
    run = run_paths()
    state = load_state(run)
    pids = running(run)
    for name in ORDER:
        pid = pids[name]
        if pid:
            log(f"  {name:<24} running  pid {pid:<7} rss {rss_mib(pid):7.0f} MiB  "
                f"log {run.log(name)}")
        else:
            log(f"  {name:<24} stopped")
    if not state or not pids.get("kube-apiserver"):
        log("control plane: down")
        return False
    kube = _kube(run, state)
    try:
        version = (kube.get("/version") or {}).get("gitVersion")
        nodes = (kube.get("/api/v1/nodes") or {}).get("items", [])
        ready = sum(1 for n in nodes if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in n.get("status", {}).get("conditions") or []))
        log(f"API server {state['server']} ({version}); nodes Ready {ready}/{len(nodes)}; "
            f"factories {', '.join(state.get('factories', [])) or '-'}")
    except httpx.HTTPError as exc:
        log(f"API server {state['server']} not answering: {exc}")
        return False
    finally:
        kube.close()
    log(f"kubeconfig: {run.kubeconfig}")
    return all(pids.values())
