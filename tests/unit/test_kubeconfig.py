"""A ``$KUBECONFIG`` list merged as kubectl merges it, and the namespace its context defaults
to (what ``-n`` means when it is not given)."""

from __future__ import annotations

from pathlib import Path

import yaml

from m2g.k8s.kubeconfig import context_namespace, merged_kubeconfig, resolve_kubeconfig


def _config(path: Path, current: str | None, contexts: dict[str, str | None],
            server: str = "https://a:6443") -> Path:
    doc = {"apiVersion": "v1", "kind": "Config",
           "contexts": [{"name": n, "context": {"cluster": "c", "user": "u",
                                                **({"namespace": ns} if ns else {})}}
                        for n, ns in contexts.items()],
           "clusters": [{"name": "c", "cluster": {"server": server}}],
           "users": [{"name": "u", "user": {"token": "t"}}]}
    if current:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_list_keeps_every_existing_file_in_order(tmp_path: Path) -> None:
    a, b = _config(tmp_path / "a", None, {}), _config(tmp_path / "b", None, {})
    env = {"KUBECONFIG": f"{a}:{tmp_path / 'missing'}:{b}:{a}"}
    assert resolve_kubeconfig(None, env=env, home=tmp_path) == f"{a}:{b}"


def test_the_first_file_wins_for_each_name_and_the_current_context(tmp_path: Path) -> None:
    a = _config(tmp_path / "a", None, {"dev": "research"}, server="https://first:6443")
    b = _config(tmp_path / "b", "dev", {"dev": "other", "prod": None},
                server="https://second:6443")
    merged = merged_kubeconfig(f"{a}:{b}")
    assert merged["current-context"] == "dev"  # only b sets one
    assert [c["name"] for c in merged["contexts"]] == ["dev", "prod"]
    assert merged["contexts"][0]["context"]["namespace"] == "research"  # a's, not b's
    assert [c["cluster"]["server"] for c in merged["clusters"]] == ["https://first:6443"]


def test_the_context_namespace_is_the_default(tmp_path: Path) -> None:
    cfg = _config(tmp_path / "k", "dev", {"dev": "research", "prod": None})
    assert context_namespace(str(cfg)) == "research"
    assert context_namespace(str(cfg), "prod") == "default"  # a context without one
    assert context_namespace(str(cfg), "nope") == "default"
    merged = {"KUBECONFIG": f"{_config(tmp_path / 'x', None, {})}:{cfg}"}
    assert context_namespace(None, env=merged, home=tmp_path) == "research"


def test_in_a_pod_the_service_accounts_namespace(tmp_path: Path) -> None:
    sa = tmp_path / "namespace"
    sa.write_text("m2g-system\n")
    assert context_namespace(None, env={}, home=tmp_path, sa_namespace=sa) == "m2g-system"
    assert context_namespace(None, env={}, home=tmp_path,
                             sa_namespace=tmp_path / "none") == "default"


def test_an_unreadable_kubeconfig_defaults_and_lets_the_command_say_why(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("{unclosed")
    assert context_namespace(str(bad)) == "default"
    scalar = tmp_path / "scalar"
    scalar.write_text("42")
    assert context_namespace(str(scalar)) == "default"
