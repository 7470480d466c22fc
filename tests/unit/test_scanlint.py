"""m2g policy lint warns about expressions that scan the factory once per workload."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from m2g.policy.scanlint import scan_warnings, scans
from m2g_cli.app import app
from tests.unit.policy_helpers import evaluator, policy


def test_scans_finds_comprehensions_over_domains_and_topology() -> None:
    assert scans("topology.racks.filter(r, r.freeGpus > workload.gpus)") == [
        "topology.racks.filter"]
    assert scans("domains.exists(k, domains[k].freeGpus > 0) && topology . cliques . all(c, true)"
                 ) == ["domains.exists", "topology.cliques.all"]
    assert scans("variables.hot.filter(r, true) || 'topology.racks.map(r, r)' == ''") == []
    assert scans("facts.cliquesFit[workload.gpus] > 0") == []


def _warnings(tmp_path: Path, stage: str, variables: str, rules: str) -> list[str]:
    ev = evaluator(tmp_path, "cel-expr-python", {
        "p.yaml": policy("p", stage, rules, extra=variables)})
    return [w.message for w in scan_warnings(ev.policy_set)]


def test_per_workload_scans_warn_snapshot_wide_ones_do_not(tmp_path: Path) -> None:
    got = _warnings(tmp_path, "Admission", """variables:
    - {name: hot, expression: "topology.racks.filter(r, r.thermal.alarm)"}
    - {name: fits, expression: "topology.racks.exists(r, r.freeGpus >= workload.gpus)"}""", """
            - {name: a, when: "!variables.fits && size(variables.hot) > 0", decision: Defer}
            - {name: b, when: "domains.exists(k, domains[k].freeGpus < workload.gpus)", decision: Defer}
        """)
    assert len(got) == 2
    assert got[0].startswith("warning: variable fits: topology.racks.exists runs once per workload")
    assert got[1].startswith("warning: rule b: domains.exists runs once per workload")


def test_capacity_stage_scans_do_not_warn(tmp_path: Path) -> None:
    assert _warnings(tmp_path, "Capacity", "", """
            - {name: a, when: "topology.racks.exists(r, r.thermal.alarm)", quota: "0"}
        """) == []


def test_lint_prints_warnings_and_exits_zero(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(policy("p", "Admission", """
            - {name: b, when: "topology.cliques.exists(c, c.freeGpus < workload.gpus)", decision: Defer}
        """))
    res = CliRunner().invoke(app, ["policy", "lint", str(tmp_path)])
    assert res.exit_code == 0
    assert "p.yaml:" in res.stdout and "warning: rule b: topology.cliques.exists" in res.stdout
