"""kubectl-driven helpers for the GitOps manifest tests (tests/e2e/test_manifests_*.py).

The manifests are rendered with ``kubectl kustomize`` and applied with
``kubectl apply --server-side``, exactly as docs/deploy.md tells a user to. ``Applied`` records
which objects existed before and deletes only the ones the test created, so objects the factory
generator made (ResourceFlavor gb200, Topology nvl72) and anything else already there survive.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import REPO, wait_until
from localcp.paths import binary

#: The site configuration the Deployment mounts (ConfigMap m2g-config).
SITE_CONFIG = REPO / "deploy" / "controller" / "site-config.yaml"

Obj = dict[str, Any]
QUEUES = ("prod-training", "research", "inference")  # kueue-config's tenant ClusterQueues

# Deletion order: dependents first (LocalQueues before their namespace and ClusterQueue, ...).
DELETE_ORDER = ["LocalQueue", "Deployment", "PodDisruptionBudget", "NetworkPolicy", "Service",
                "ServiceMonitor", "ConfigMap", "RoleBinding", "Role", "ServiceAccount",
                "Namespace", "PriorityClass", "ClusterQueue", "Cohort", "AdmissionCheck",
                "WorkloadPriorityClass", "ResourceFlavor", "Topology", "Policy",
                "ClusterRoleBinding", "ClusterRole", "CustomResourceDefinition"]


def kubectl_path() -> str:
    local = binary("kubectl")
    found = str(local) if local.exists() else shutil.which("kubectl")
    if found is None:
        pytest.skip("no kubectl (build it: kind-e2e/tools/build.sh kubectl)")
    return found


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None,
            check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([kubectl_path(), f"--kubeconfig={kubeconfig}", *args], input=stdin,
                         capture_output=True, text=True, check=False, timeout=timeout)
    if check and out.returncode != 0:
        pytest.fail(f"kubectl {' '.join(args)} failed ({out.returncode}):\n{out.stderr}",
                    pytrace=False)
    return out


def render(folder: str) -> str:
    """``kubectl kustomize <repo>/<folder>`` (no cluster needed)."""
    out = subprocess.run([kubectl_path(), "kustomize", str(REPO / folder)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def objects(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if d]


def ref(obj: Obj) -> list[str]:
    """kubectl arguments naming ``obj``: ``kind.group/name`` and ``-n ns`` when namespaced."""
    group = obj["apiVersion"].rpartition("/")[0]
    kind = obj["kind"].lower() + (f".{group}" if group else "")
    args = [f"{kind}/{obj['metadata']['name']}"]
    if obj["metadata"].get("namespace"):
        args += ["-n", obj["metadata"]["namespace"]]
    return args


def exists(kubeconfig: Path, obj: Obj) -> bool:
    return kubectl(kubeconfig, "get", *ref(obj), "-o", "name", check=False).returncode == 0


def get_json(kubeconfig: Path, *args: str) -> Any:
    """``kubectl get ARGS -o json`` parsed, or None when kubectl fails (e.g. not found)."""
    out = kubectl(kubeconfig, "get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def get(kubeconfig: Path, obj: Obj) -> Obj:
    out = kubectl(kubeconfig, "get", *ref(obj), "-o", "yaml")
    got: Obj = yaml.safe_load(out.stdout)
    return got


@dataclass
class Applied:
    """Server-side apply rendered manifests; ``delete()`` removes what was not there before."""

    kubeconfig: Path
    created: list[Obj] = field(default_factory=list)

    def apply(self, text: str, *extra: str) -> subprocess.CompletedProcess[str]:
        for obj in objects(text):
            if not exists(self.kubeconfig, obj) and not any(
                    ref(obj) == ref(c) for c in self.created):
                self.created.append(obj)
        return kubectl(self.kubeconfig, "apply", "--server-side", *extra, "-f", "-",
                       stdin=text)

    def delete(self) -> None:
        rank = {k: i for i, k in enumerate(DELETE_ORDER)}
        for obj in sorted(self.created, key=lambda o: rank.get(o["kind"], -1)):
            kubectl(self.kubeconfig, "delete", *ref(obj), "--ignore-not-found",
                    "--wait=true", "--timeout=120s", check=False)
        self.created.clear()


def apply_crds(applied: Applied, folder: str = "deploy/crds") -> None:
    """Server-side apply m2g's CRDs and wait until the API server serves them."""
    crds = render(folder)
    applied.apply(crds)
    for crd in objects(crds):
        kubectl(applied.kubeconfig, "wait", "--for=condition=Established", "--timeout=60s",
                f"crd/{crd['metadata']['name']}")


def generations(kubeconfig: Path, text: str) -> dict[str, tuple[Any, Any]]:
    """metadata.generation (spec changes) of every object, by kubectl name."""
    out: dict[str, tuple[Any, Any]] = {}
    for obj in objects(text):
        live = get(kubeconfig, obj)["metadata"]
        out[" ".join(ref(obj))] = (live.get("generation"), live.get("uid"))
    return out


def in_sync(kubeconfig: Path, text: str) -> subprocess.CompletedProcess[str]:
    """``kubectl diff --server-side``: exit 0 when the cluster already matches the manifests."""
    return kubectl(kubeconfig, "diff", "--server-side", "-f", "-", stdin=text, check=False)


def sa_kubeconfig(kubeconfig: Path, path: Path, namespace: str = "m2g-system",
                  name: str = "m2g") -> Path:
    """A kubeconfig at ``path`` that authenticates as the ServiceAccount with a short-lived
    token from the TokenRequest API (what a pod of the Deployment gets)."""
    token = kubectl(kubeconfig, "create", "token", name, "-n", namespace,
                    "--duration=30m").stdout.strip()
    admin = yaml.safe_load(kubectl(kubeconfig, "config", "view", "--minify", "--raw",
                                   "-o", "yaml").stdout)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": "c", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "c", "user": name}}]}))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status), resp.read().decode()
    except OSError:
        return 0, ""


@contextlib.contextmanager
def controller(kubeconfig: Path, log: Path, *args: str) -> Iterator[str]:
    """``m2g run --kubeconfig <kubeconfig> --leader-elect ... <args>`` in a subprocess, as the
    Deployment runs it — with ``--prometheus URL`` in ``args`` also with the Deployment's site
    configuration (the flag overrides its in-cluster URL); yields its base URL once /readyz
    answers 200; stopped afterwards."""
    port = _free_port()
    site = ["--config", str(SITE_CONFIG)] if "--prometheus" in args else []
    cmd = [sys.executable, "-c", "from m2g_cli.app import main; main()", "run", *site,
           "--kubeconfig", str(kubeconfig), "--leader-elect", "--lease-namespace", "m2g-system",
           "--metrics-host", "127.0.0.1", "--metrics-port", str(port), *args]
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until("m2g run to be ready", lambda: proc.poll() is None and http_get(
            f"{url}/readyz")[0] == 200, timeout=60)
        yield url
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def denied_lines(log: Path) -> list[str]:
    """Lines of a controller log that show a request the API server refused (401/403)."""
    return [line for line in log.read_text().splitlines()
            if " 403 " in line or "Forbidden" in line or "forbidden" in line
            or " 401 " in line]


def job(name: str, namespace: str) -> dict[str, Any]:
    """A 1-pod, 4-GPU Job for a tenant's LocalQueue "default", placed in one rack."""
    pod = {"metadata": {"annotations": {"kueue.x-k8s.io/podset-required-topology":
                                        "network.topology.nvidia.com/accelerator"}},
           "spec": {"restartPolicy": "Never", "containers": [{
               "name": "main", "image": "busybox",
               "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "4"},
                             "limits": {"nvidia.com/gpu": "4"}}}]}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"kueue.x-k8s.io/queue-name": "default",
                                    "kueue.x-k8s.io/priority-class": "m2g-fine-tuning"}},
            "spec": {"parallelism": 1, "completions": 1, "suspend": True, "template": pod}}
