"""m2g.k8s.client: error classification, kubeconfig resolution, resource paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from m2g.k8s import client as c


@pytest.mark.parametrize(("status", "body", "cls"), [
    (404, {"reason": "NotFound", "message": 'workloads "x" not found',
           "details": {"name": "x", "kind": "workloads"}}, c.NotFound),
    (404, {"reason": "NotFound", "message": "the server could not find the requested resource",
           "details": {}}, c.ResourceMissing),
    (409, {"reason": "Conflict", "message": "the object has been modified"}, c.Conflict),
    (409, {"reason": "AlreadyExists", "message": "exists"}, c.AlreadyExists),
    (410, {"reason": "Expired", "message": "too old resource version: 1 (267)"}, c.Gone),
    (429, {"reason": "TooManyRequests"}, c.RetryableError),
    (500, "boom\nwith a second line", c.RetryableError),
    (503, {}, c.RetryableError),
    (403, {"reason": "Forbidden", "message": "user cannot list"}, c.PermanentError),
    (422, {"reason": "Invalid", "message": "spec.x: Invalid value"}, c.PermanentError),
])
def test_errors_are_classified(status: int, body: object, cls: type[c.KubeError]) -> None:
    err = c.error_from_response("GET", "/apis/kueue.x-k8s.io/v1beta2/workloads/x", status, body)
    assert type(err) is cls
    assert err.status == status
    assert "\n" not in str(err)
    retryable = issubclass(cls, c.RetryableError)
    assert isinstance(err, c.RetryableError) is retryable
    assert isinstance(err, c.PermanentError) is not retryable


def test_missing_kueue_crd_says_so() -> None:
    err = c.error_from_response("GET", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues", 404,
                                {"reason": "NotFound", "message": "page not found"})
    assert str(err).startswith("Kueue CRDs not installed")


def test_paths() -> None:
    assert c.NODES.path() == "/api/v1/nodes"
    assert c.PODS.path("ns") == "/api/v1/namespaces/ns/pods"
    assert c.WORKLOADS.path("ns", "w", "status") == \
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/w/status"
    assert c.CLUSTER_QUEUES.path("ignored", "cq") == \
        "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/cq"
    assert c.LEASES.api_version == "coordination.k8s.io/v1"


def test_kubeconfig_resolution(tmp_path: Path) -> None:
    home = tmp_path / "home"
    explicit = tmp_path / "explicit"
    env_file = tmp_path / "env-config"
    env_file.write_text("{}")
    assert c.resolve_kubeconfig(explicit, env={}, home=home) == str(explicit)
    missing = str(tmp_path / "missing")
    assert c.resolve_kubeconfig(None, env={"KUBECONFIG": f"{missing}:{env_file}"},
                                home=home) == str(env_file)
    assert c.resolve_kubeconfig(None, env={}, home=home) is None  # in-cluster
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text("{}")
    assert c.resolve_kubeconfig(None, env={}, home=home) == str(home / ".kube" / "config")


async def test_connect_with_bad_kubeconfig_is_permanent(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(c.PermanentError):
        await c.connect(bad, context="nope")


async def test_connect_with_a_file_that_is_not_yaml_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "README.md"
    bad.write_text("# m2g\n\nMake it: run this: now\n")
    with pytest.raises(c.PermanentError) as err:
        await c.connect(bad)
    assert str(err.value) == (f"{bad} is not a kubeconfig: unreadable YAML at line 3 "
                              "(mapping values are not allowed here)")


def test_one_error_family_for_every_adapter() -> None:
    """The API server's and Prometheus's errors are m2g.errors' RetryableError/PermanentError
    (defined once), each with its one-line message and the server's Status fields."""
    from m2g import errors
    from m2g.k8s import client as kc
    from m2g.signals import prometheus

    assert kc.RetryableError is prometheus.RetryableError is errors.RetryableError
    assert kc.PermanentError is prometheus.PermanentError is errors.PermanentError
    exc = kc.error_from_response("POST", "/api/v1/namespaces/ml/pods", 403, {
        "kind": "Status", "reason": "Forbidden", "message": 'pods is forbidden:\n User "u"'})
    assert isinstance(exc, errors.PermanentError) and isinstance(exc, kc.KubeError)
    assert (exc.status, exc.reason, exc.api_message) == (403, "Forbidden",
                                                        'pods is forbidden: User "u"')
    assert "\n" not in str(exc)
    assert issubclass(prometheus.BadQueryError, errors.PermanentError)
