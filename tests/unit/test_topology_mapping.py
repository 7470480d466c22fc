"""The site's topology label mapping (site configuration ``topology``): parsing, the Topology
objects generated from it (``m2g topology generate``), and policies that follow it
(``site.labels`` in CEL, ``${site.labels.X}`` podSetUpdates keys)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from m2g.config import SiteConfigError, parse_site_config
from m2g.config.site import SiteConfig
from m2g.config.topology import topology_objects
from m2g.k8s import build as kb
from m2g.model import labels as L
from m2g.model.factory import site_view
from m2g.model.inputs import PolicyInput
from m2g.policy import Evaluator, PolicySetError, build, read_texts
from m2g.policy.runtime import make_runtime
from m2g_cli.app import app

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SITE = """\
apiVersion: m2g.io/v1alpha1
kind: SiteConfig
topology:
  name: nvl72
  labels:
    clique: nvidia.com/gpu.clique
    rack: ds.coreweave.com/nvlink.domain
    block: ""
    powerDomain: example.com/power-row
  flavor:
    name: gb300
    nodeLabels: {nvidia.com/gpu.product: NVIDIA-GB300}
"""


def test_defaults_are_what_a_gb300_cluster_carries() -> None:
    t = SiteConfig().topology
    assert (t.labels.clique, t.labels.rack, t.labels.block, t.labels.power_domain) == (
        "nvidia.com/gpu.clique", "network.topology.nvidia.com/accelerator",
        "network.topology.nvidia.com/block", "")
    assert not any(k.startswith("m2g.io/") for k in t.labels.levels())


def test_site_mapping_parses_and_levels_skip_what_the_site_lacks() -> None:
    site = parse_site_config(SITE, "site.yaml")
    assert site.topology.labels.levels() == (
        "ds.coreweave.com/nvlink.domain", "nvidia.com/gpu.clique", "kubernetes.io/hostname")
    assert site.planner_config().kai_topology_levels == site.topology.labels.levels()
    same = L.TopologyLabels(rack="nvidia.com/gpu.clique")  # racks are cliques: one level
    assert same.levels() == ("network.topology.nvidia.com/block", "nvidia.com/gpu.clique",
                             "kubernetes.io/hostname")


def test_an_unknown_mapping_key_is_rejected_with_its_line() -> None:
    with pytest.raises(SiteConfigError) as err:
        parse_site_config(SITE.replace("    block: \"\"", "    blok: x"), "site.yaml")
    assert err.value.problems[0].startswith("site.yaml:8:")
    assert "blok" in err.value.problems[0]


def test_generated_objects_follow_the_mapping() -> None:
    site = parse_site_config(SITE, "site.yaml")
    kueue, flavor, kai = topology_objects(site.topology)
    levels = [lv["nodeLabel"] for lv in kueue["spec"]["levels"]]
    assert levels == ["ds.coreweave.com/nvlink.domain", "nvidia.com/gpu.clique",
                      "kubernetes.io/hostname"]
    assert flavor["metadata"]["name"] == "gb300"
    assert flavor["spec"] == {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
                              "topologyName": "nvl72"}
    assert [lv["nodeLabel"] for lv in kai["spec"]["levels"]] == levels
    assert topology_objects(site.topology, kueue=False) == [kai]


def test_cli_generate_yaml_and_json_list(tmp_path: Any) -> None:
    cfg = tmp_path / "site.yaml"
    cfg.write_text(SITE)
    run = CliRunner().invoke(app, ["topology", "generate", "--config", str(cfg)])
    assert run.exit_code == 0, run.output
    docs = list(yaml.safe_load_all(run.output))
    assert [d["kind"] for d in docs] == ["Topology", "ResourceFlavor", "Topology"]
    run = CliRunner().invoke(app, ["topology", "generate", "-c", str(cfg), "-o", "json",
                                   "--no-kai"])
    out = json.loads(run.output)
    assert out["kind"] == "List" and [i["kind"] for i in out["items"]] == \
        ["Topology", "ResourceFlavor"]
    cfg.write_text(SITE + "bogus: 1\n")
    run = CliRunner().invoke(app, ["topology", "generate", "--config", str(cfg)])
    assert run.exit_code == 2 and "bogus" in run.output


def _gpu_node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_snapshot_reads_racks_through_the_mapping_and_says_which_label_selects_them() -> None:
    nodes = {f"n{i}": _gpu_node(f"n{i}", {"nvidia.com/gpu.clique": f"u.{i // 2}",
                                          "example.com/row": "row-1"}) for i in range(4)}
    site = L.TopologyLabels(power_domain="example.com/row")
    snap = kb.build_snapshot(kb.ClusterObjects(nodes=nodes), None, NOW, labels=site)
    assert [r.name for r in snap.factory.racks] == ["u.0", "u.1"]  # no Topograph: cliques
    assert {r.power_domain for r in snap.factory.racks} == {"row-1"}
    # nodes carry no rack label, so the label that selects a rack is the clique's
    assert site_view(snap.factory).labels.rack == "nvidia.com/gpu.clique"
    for n in nodes.values():
        n["metadata"]["labels"][L.TOPOGRAPH_ACCELERATOR] = "rack-a"
    snap = kb.build_snapshot(kb.ClusterObjects(nodes=nodes), None, NOW, labels=site)
    assert [r.name for r in snap.factory.racks] == ["rack-a"]
    assert site_view(snap.factory).labels.rack == L.TOPOGRAPH_ACCELERATOR


POLICY = """\
apiVersion: m2g.io/v1alpha1
kind: Policy
metadata: {name: pin}
spec:
  stage: Admission
  rules:
    - name: pin
      when: "true"
      decision: Admit
      podSetUpdates:
        - nodeSelector:
            "${site.labels.rack}": "'r1'"
            "${site.labels.powerDomain}": "'pd'"
"""


def _evaluator(text: str) -> Evaluator:
    return Evaluator(build(read_texts({"p.yaml": text}), make_runtime(None)))


def test_label_key_placeholders_are_written_as_the_sites_labels() -> None:
    ev = _evaluator(POLICY)
    got = ev.admission(PolicyInput.model_validate({"workload": {"name": "w", "gpus": 4}}))
    assert [u.node_selector for u in got.pod_set_updates] == [{L.TOPOGRAPH_ACCELERATOR: "r1"}]
    inp = PolicyInput.model_validate({"workload": {"name": "w", "gpus": 4}, "site": {
        "labels": {"rack": "nvidia.com/gpu.clique", "powerDomain": "example.com/row"}}})
    got = ev.admission(inp)
    assert [u.node_selector for u in got.pod_set_updates] == [
        {"nvidia.com/gpu.clique": "r1", "example.com/row": "pd"}]


def test_an_unknown_placeholder_key_is_a_compile_problem() -> None:
    with pytest.raises(PolicySetError) as err:
        _evaluator(POLICY.replace("site.labels.rack", "site.labels.row"))
    assert "${site.labels.row}" in str(err.value)
