"""The Helm chart, end to end: ``helm template`` → server-side apply onto the local control
plane, then the controller started the way the chart's Deployment starts it — its command and
environment, the chart's ConfigMap as the --config file (its Prometheus URL pointed at a
Prometheus stand-in holding DCGM exporter and facility series), and a token of the chart's
ServiceAccount — as a local process (the factory's KWOK nodes, labelled as GFD and Topograph
label a GB300 cluster, run no real pods). It must lead, make m2g-policy Active so the tenant
queues turn Active, answer a tenant job's check, read the PDUs' draw, answer a second
AdmissionCheck of its controller with its own name, admit a job from every template that
renders to a plain Job and a JobSet from every template that renders to one (``m2g submit``)
on the first try, the JobSets' child Jobs running their pods where Kueue placed them, hold the
queues when DCGM reports XID 79 on most GPUs, show all of it in ``m2g status``, and never be
refused by the API server (the chart's RBAC is the controller's).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import REPO, Cluster, condition, unique, wait_until
from fake_prometheus import DCGM, KEYS, fake_prometheus
from localcp.paths import binary
from manifests_helpers import (
    QUEUES,
    Applied,
    _free_port,
    denied_lines,
    get_json,
    http_get,
    job,
    kubectl,
    objects,
    render,
    sa_kubeconfig,
)
from template_runs import (
    JOB_TEMPLATES,
    JOBSET_TEMPLATES,
    nodes_carry_only_real_cluster_labels,
    run_template,
)
from tests.image import oci

pytestmark = pytest.mark.e2e

NS = "m2g-system"
GPU = "nvidia.com/gpu"
RACK_LABEL = "network.topology.nvidia.com/accelerator"  # Topograph's, the default mapping
FLAVOR = "gb200"  # kueue-config's nvl72 overlay (the small factory's product)
CHART = REPO / "charts" / "m2g"


def helm_template(*values: str) -> str:
    helm = binary("helm")
    if not helm.exists():
        pytest.skip("no helm (build it: kind-e2e/tools/build.sh helm)")
    out = subprocess.run([str(helm), "template", "m2g", str(CHART), "--namespace", NS, *values],
                         capture_output=True, text=True, check=False,
                         env={**os.environ, "HELM_CACHE_HOME": "/tmp/m2g-helm-cache",
                              "HELM_CONFIG_HOME": "/tmp/m2g-helm-config"})
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def port() -> int:
    return _free_port()


@pytest.fixture(scope="module")
def chart(kubeconfig: Path, port: int) -> Iterator[list[dict[str, Any]]]:
    """kueue-config's nvl72 overlay, then the chart: its CRDs first, then everything else."""
    text = helm_template("--set", "namespace.create=true", "--set", f"metrics.port={port}")
    docs = objects(text)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    applied = Applied(kubeconfig)
    try:
        applied.apply(render("kueue-config/overlays/nvl72"))
        applied.apply(yaml.safe_dump_all(crds))
        for crd in crds:
            kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s",
                    f"crd/{crd['metadata']['name']}")
        applied.apply(yaml.safe_dump_all(rest))
        # Idempotent: the same manifests again change nothing.
        again = kubectl(kubeconfig, "diff", "--server-side", "-f", "-", stdin=text, check=False)
        assert again.returncode == 0, again.stdout[-2000:]
        yield docs
    finally:
        applied.delete()


def _container(docs: list[dict[str, Any]], prometheus: str
               ) -> tuple[dict[str, Any], Path, str]:
    """The Deployment's container, where its command reads the config file (inside the
    ConfigMap's mount) and that file: the chart's ConfigMap with the site's Prometheus URL set
    to ``prometheus`` (what an operator edits)."""
    (dep,) = (d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (cm,) = (d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] ==
             next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v))
    site = yaml.safe_load(cm["data"]["config.yaml"])
    site["prometheus"]["url"] = prometheus
    cmd = container["command"]
    assert cmd[0] == "m2g"  # the image's entry point
    path = Path(cmd[cmd.index("--config") + 1])
    mount = next(m for m in container["volumeMounts"]
                 if path.is_relative_to(m["mountPath"]))
    assert path.relative_to(mount["mountPath"]) == Path("config.yaml")
    return container, path, yaml.safe_dump(site)


def _pod_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's env (the downward API's pod name and namespace)."""
    env = {}
    for var in container["env"]:
        field = var["valueFrom"]["fieldRef"]["fieldPath"]
        env[var["name"]] = {"metadata.name": "m2g-chart-e2e-0", "metadata.namespace": NS}[field]
    return env


def deployment_command(docs: list[dict[str, Any]], config: Path, kube: Path,
                       prometheus: str) -> tuple[list[str], dict[str, str]]:
    """The Deployment's container command and env, made runnable here: this venv's m2g, the
    ConfigMap's file at ``config``, the ServiceAccount's kubeconfig, metrics on loopback."""
    container, path, site = _container(docs, prometheus)
    config.write_text(site)
    cmd = list(container["command"])
    cmd[cmd.index(str(path))] = str(config)
    cmd = [sys.executable, "-c", "from m2g_cli.app import main; main()", *cmd[1:],
           "--kubeconfig", str(kube), "--metrics-host", "127.0.0.1"]
    env = {**os.environ, **_pod_env(container)}
    env.pop("M2G_CONFIG", None)
    return cmd, env


def image_command(docs: list[dict[str, Any]], rootfs: Path, kubeconfig: Path,
                  prometheus: str) -> tuple[list[str], dict[str, str]]:
    """The Deployment's container as its kubelet would start it, without a container engine:
    the image's root filesystem (chroot as the image's user, only its PATH), the ConfigMap's
    file at its mount path, the ServiceAccount's token, CA and namespace where a pod has them
    (/var/run/secrets/kubernetes.io/serviceaccount) and KUBERNETES_SERVICE_HOST/PORT — m2g's
    in-cluster configuration, no kubeconfig — and the Deployment's command unchanged."""
    container, path, site = _container(docs, prometheus)
    config = oci.path_in(rootfs, str(path))
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(site)
    admin = yaml.safe_load(kubectl(kubeconfig, "config", "view", "--minify", "--raw",
                                   "-o", "yaml").stdout)["clusters"][0]["cluster"]
    sa = oci.path_in(rootfs, "/var/run/secrets/kubernetes.io/serviceaccount")
    sa.mkdir(parents=True, exist_ok=True)
    (sa / "token").write_text(kubectl(kubeconfig, "create", "token", "m2g", "-n", NS,
                                      "--duration=30m").stdout.strip())
    (sa / "ca.crt").write_bytes(base64.b64decode(admin["certificate-authority-data"])
                                if "certificate-authority-data" in admin
                                else Path(admin["certificate-authority"]).read_bytes())
    (sa / "namespace").write_text(NS)
    for f in sa.iterdir():
        f.chmod(0o644)
    server = urllib.parse.urlsplit(admin["server"])
    env = {"KUBERNETES_SERVICE_HOST": str(server.hostname),
           "KUBERNETES_SERVICE_PORT": str(server.port or 443), **_pod_env(container)}
    return oci.argv(rootfs, *container["command"], env=env), {"PATH": os.environ["PATH"]}


def dcgm_and_facility_series(kubeconfig: Path, pdu_kw: float) -> dict[str, dict[str, float]]:
    """What a real site's Prometheus holds for the factory: the DCGM exporter's series for
    every GPU of every GPU node (label ``Hostname``) and a PDU, inlet and coolant series per
    rack (the rack label of the nodes, Topograph's by default)."""
    series: dict[str, dict[str, float]] = {m: {} for m in (*DCGM, *KEYS)}
    for node in get_json(kubeconfig, "nodes")["items"]:
        labels = node["metadata"].get("labels") or {}
        gpus = int((node.get("status") or {}).get("capacity", {}).get(GPU, 0))
        rack = labels.get(RACK_LABEL)
        if not gpus or not rack:
            continue
        host = labels.get("kubernetes.io/hostname", node["metadata"]["name"])
        for g in range(gpus):
            series["DCGM_FI_DEV_POWER_USAGE"][f"{host}/{g}"] = 700.0
            series["DCGM_FI_DEV_GPU_TEMP"][f"{host}/{g}"] = 52.0
            series["DCGM_FI_DEV_XID_ERRORS"][f"{host}/{g}"] = 0.0
        series["facility_pdu_power_watts"][rack] = pdu_kw * 1000
        series["facility_rack_inlet_temperature_celsius"][rack] = 24.0
        series["facility_rack_coolant_supply_temperature_celsius"][rack] = 30.0
    return series


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _second_check_is_answered(kubeconfig: Path) -> None:
    """A second AdmissionCheck of controller m2g.io/policy, with its own name, gating its own
    ClusterQueue: m2g makes it Active and answers its workloads."""
    check, cq, ns = unique("m2g-second"), unique("chart-second"), unique("second")
    objs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
         "metadata": {"name": check}, "spec": {"controllerName": "m2g.io/policy"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                  "admissionChecksStrategy": {"admissionChecks": [{"name": check}]},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU], "flavors": [
                      {"name": FLAVOR, "resources": [
                          {"name": "cpu", "nominalQuota": "144"},
                          {"name": "memory", "nominalQuota": "1000Gi"},
                          {"name": GPU, "nominalQuota": "8"}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "default", "namespace": ns}, "spec": {"clusterQueue": cq}},
    ]
    try:
        kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(objs))
        wait_until(f"{check} to be Active", lambda: (c := condition(get_json(
            kubeconfig, f"admissionchecks.kueue.x-k8s.io/{check}"), "Active")) and
            c["status"] == "True", timeout=60)
        body = job("second", ns)
        kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(body))

        def state() -> str | None:
            for wl in (get_json(kubeconfig, "workloads.kueue.x-k8s.io", "-n", ns) or {}).get(
                    "items", []):
                for c in wl.get("status", {}).get("admissionChecks", []):
                    if c["name"] == check and c["state"] != "Pending":
                        return str(c["state"])
            return None
        assert wait_until(f"m2g to answer {check}", state, timeout=90) == "Ready"
    finally:
        kubectl(kubeconfig, "delete", "namespace", ns, "--wait=false", check=False)
        kubectl(kubeconfig, "delete", f"clusterqueues.kueue.x-k8s.io/{cq}",
                f"admissionchecks.kueue.x-k8s.io/{check}", "--wait=false", check=False)


def _every_template_is_admitted_on_the_first_try(kubeconfig: Path, cluster: Cluster) -> None:
    """What a tenant does first: ``m2g submit`` each template into kueue-config's research queue
    (template defaults: its priority class, its clique/block levels), one at a time, as a plain
    batch/v1 Job where it renders to one and as a JobSet where it renders to one. Each is
    admitted without a requeue, with the chart's controller answering m2g-policy Ready, and
    placed where it asks; a JobSet's child Jobs then run every pod on the hosts Kueue assigned
    (the local control plane's JobSet controller). (``scheduler=default``: the local control
    plane runs no KAI scheduler; admission does not depend on it.)"""
    for api, names in (("Job", JOB_TEMPLATES), ("JobSet", JOBSET_TEMPLATES)):
        for name in names:
            run_template(kubeconfig, cluster, "research", name, api,
                         "--set", "scheduler=default")


def _xid_on_most_gpus_holds_the_queues(kubeconfig: Path, series: dict[str, dict[str, float]]
                                       ) -> None:
    """XID 79 (GPU fallen off the bus) on more than half of the GPUs, as the DCGM exporter
    reports it: health-quota holds the tenant queues (stopPolicy Hold) — m2g read it; once the
    GPUs report no XID again m2g lifts the Hold it set (it never did before: nothing recorded
    that the Hold was m2g's, so the queues stayed held)."""
    def held() -> list[str]:
        return [q for q in QUEUES if (get_json(
            kubeconfig, f"clusterqueues.kueue.x-k8s.io/{q}") or {}).get("spec", {}).get(
            "stopPolicy") == "Hold"]
    assert held() == []  # healthy readings: nothing held
    xid = series["DCGM_FI_DEV_XID_ERRORS"]
    for key in sorted(xid)[: len(xid) * 3 // 4]:
        xid[key] = 79.0
    assert wait_until("the tenant queues held for XID 79", held, timeout=90)
    for key in xid:
        xid[key] = 0.0
    wait_until("the Hold lifted once the GPUs recover", lambda: held() == [], timeout=90)


def test_the_chart_installs_and_its_controller_governs_the_queues(
        kubeconfig: Path, cluster: Cluster, chart: list[dict[str, Any]], port: int,
        tmp_path: Path) -> None:
    policies = sum(d["kind"] == "Policy" for d in chart)
    assert policies >= 10 and len(get_json(kubeconfig, "policies.m2g.io")["items"]) >= policies
    nodes_carry_only_real_cluster_labels(cluster)  # Done means: labelled as GB300 sites are
    sa = sa_kubeconfig(kubeconfig, tmp_path / "sa.kubeconfig")
    series = dcgm_and_facility_series(kubeconfig, pdu_kw=40.0)
    racks = len(series["facility_pdu_power_watts"])
    assert racks and series["DCGM_FI_DEV_XID_ERRORS"], "no GPU node with a rack label"
    with contextlib.ExitStack() as stack:
        prom = stack.enter_context(fake_prometheus(series))
        cmd, env = deployment_command(chart, tmp_path / "config.yaml", sa, prom)
        _govern(kubeconfig, cluster, chart, cmd, env, port, tmp_path, series, racks)


def _govern(kubeconfig: Path, cluster: Cluster, chart: list[dict[str, Any]], cmd: list[str],
            env: dict[str, str], port: int, tmp_path: Path, series: dict[str, dict[str, float]],
            racks: int, xid: bool = True) -> None:
    policies = sum(d["kind"] == "Policy" for d in chart)
    log = tmp_path / "m2g.log"
    url = f"http://127.0.0.1:{port}"
    name = unique("chart")
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until("m2g to lead with every policy loaded", lambda: proc.poll() is None and (
            "m2g_leader 1.0" in (m := http_get(f"{url}/metrics")[1])
            and f"m2g_policies_loaded {float(policies)}" in m), timeout=90)
        holder = kubectl(kubeconfig, "get", "leases.coordination.k8s.io/m2g-controller", "-n",
                         NS, "-o", "jsonpath={.spec.holderIdentity}").stdout
        assert holder == "m2g-chart-e2e-0"  # POD_NAME, in POD_NAMESPACE
        for queue in QUEUES:
            wait_until(f"{queue} to be Active", lambda q=queue: (
                (c := condition(get_json(kubeconfig, f"clusterqueues.kueue.x-k8s.io/{q}"),
                                "Active")) and c["status"] == "True"), timeout=60)
        kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(job(name, "research")))

        def answered() -> bool:
            for wl in get_json(kubeconfig, "workloads.kueue.x-k8s.io", "-n",
                               "research")["items"]:
                if any(o.get("name") == name for o in wl["metadata"].get("ownerReferences", [])):
                    return any(c["name"] == "m2g-policy" and c["state"] != "Pending"
                               for c in wl.get("status", {}).get("admissionChecks", []))
            return False

        wait_until("m2g to answer the job's admission check", answered, timeout=90)
        assert proc.poll() is None, log.read_text()[-3000:]
        # what an operator asks first: is m2g in charge? (the CLI, as the operator runs it)
        shown = subprocess.run(
            [sys.executable, "-c", "from m2g_cli.app import main; main()", "status", "-o",
             "json", "--lease-namespace", NS, "--kubeconfig", str(kubeconfig)],
            capture_output=True, text=True, check=False, timeout=120)
        assert shown.returncode == 0, shown.stderr
        st = json.loads(shown.stdout)
        assert (st["leader"]["holder"], st["leader"]["state"]) == ("m2g-chart-e2e-0", "Leading")
        assert st["policies"] and all(p["ready"] == "True" for p in st["policies"]), \
            [p for p in st["policies"] if p["ready"] != "True"]
        assert {"name": "m2g-policy", "active": "True"}.items() <= next(
            c for c in st["admissionChecks"] if c["name"] == "m2g-policy").items()
        # the controller reads the site's series through the ConfigMap's Prometheus URL
        wait_until("the controller to read the PDUs' draw", lambda: metric(
            http_get(f"{url}/metrics")[1], "m2g_site_draw_kilowatts") == 40.0 * racks,
            timeout=60)
        kubectl(kubeconfig, "delete", "job", name, "-n", "research", "--wait=true",
                "--timeout=90s", check=False)
        _second_check_is_answered(kubeconfig)
        _every_template_is_admitted_on_the_first_try(kubeconfig, cluster)
        if xid:
            _xid_on_most_gpus_holds_the_queues(kubeconfig, series)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        kubectl(kubeconfig, "delete", "job", name, "-n", "research", "--ignore-not-found",
                "--wait=false", check=False)
        kubectl(kubeconfig, "delete", "leases.coordination.k8s.io/m2g-controller", "-n", NS,
                "--ignore-not-found", check=False)
    assert not denied_lines(log), denied_lines(log)[:5]


@pytest.mark.image
def test_the_image_runs_the_chart_s_controller_in_cluster(
        kubeconfig: Path, cluster: Cluster, chart: list[dict[str, Any]], port: int,
        tmp_path: Path) -> None:
    """The image of ``make image`` (``make image-test`` runs this; ``make test`` does not):
    its entry point with the Deployment's command, in-cluster credentials only, as user 65532
    in its own root filesystem — leads, answers both checks, reads the PDUs' draw."""
    rootfs = oci.unpack_rootfs(oci.unpack_layout(tmp_path / "oci"), tmp_path / "bundle")
    series = dcgm_and_facility_series(kubeconfig, pdu_kw=40.0)
    racks = len(series["facility_pdu_power_watts"])
    with fake_prometheus(series) as prom:
        cmd, env = image_command(chart, rootfs, kubeconfig, prom)
        _govern(kubeconfig, cluster, chart, cmd, env, port, tmp_path, series, racks, xid=False)
