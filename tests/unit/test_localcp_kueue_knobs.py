"""The local control plane's two Kueue knobs for an experiment: extra feature gates
(``M2G_KUEUE_FEATURE_GATES``) and the log verbosity (``M2G_KUEUE_LOG_LEVEL``); unset, Kueue
runs as before (info, the one gate m2g needs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "kind-e2e"))
from localcp import UserError, kueue  # noqa: E402

PORTS = {k: 1 for k in ("kueue_health", "kueue_metrics", "kueue_webhook", "kueue_visibility")}


def test_unset_kueue_runs_at_info_with_only_the_elastic_tas_gate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("M2G_KUEUE_FEATURE_GATES", raising=False)
    monkeypatch.delenv("M2G_KUEUE_LOG_LEVEL", raising=False)
    cfg = yaml.safe_load(Path(kueue.config(tmp_path, tmp_path, PORTS)).read_text())
    assert cfg["featureGates"] == {"ElasticJobsViaWorkloadSlicesWithTAS": True}
    assert kueue.log_level() == "info"


def test_extra_gates_are_added_to_the_configuration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("M2G_KUEUE_FEATURE_GATES",
                       " SchedulingEquivalenceHashing=false, SchedulerLongRequeueInterval=TRUE ")
    cfg = yaml.safe_load(Path(kueue.config(tmp_path, tmp_path, PORTS)).read_text())
    assert cfg["featureGates"] == {"ElasticJobsViaWorkloadSlicesWithTAS": True,
                                   "SchedulingEquivalenceHashing": False,
                                   "SchedulerLongRequeueInterval": True}


@pytest.mark.parametrize("raw", ["Gate", "Gate=maybe", "=true", "A=true,B"])
def test_a_malformed_gate_is_a_one_line_error(raw: str) -> None:
    with pytest.raises(UserError, match="M2G_KUEUE_FEATURE_GATES"):
        kueue.feature_gates(raw)


@pytest.mark.parametrize(("raw", "want"), [("3", "3"), (" debug ", "debug"), ("", "info")])
def test_the_log_level(raw: str, want: str) -> None:
    assert kueue.log_level(raw) == want


@pytest.mark.parametrize("raw", ["0", "11", "verbose", "-1"])
def test_a_bad_log_level_is_a_one_line_error(raw: str) -> None:
    with pytest.raises(UserError, match="M2G_KUEUE_LOG_LEVEL"):
        kueue.log_level(raw)


def test_shipped_controller_workers_only_when_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset: no ``controller`` block (Kueue runs one worker per kind); ``shipped``: the
    shipped Configuration's (Job 5, Workload 10)."""
    monkeypatch.delenv("M2G_KUEUE_CONTROLLER", raising=False)
    cfg = yaml.safe_load(Path(kueue.config(tmp_path, tmp_path, PORTS)).read_text())
    assert "controller" not in cfg
    monkeypatch.setenv("M2G_KUEUE_CONTROLLER", "shipped")
    cfg = yaml.safe_load(Path(kueue.config(tmp_path, tmp_path, PORTS)).read_text())
    assert cfg["controller"]["groupKindConcurrency"]["Job.batch"] == 5
    assert cfg["controller"]["groupKindConcurrency"]["Workload.kueue.x-k8s.io"] == 10


def test_another_controller_value_is_a_one_line_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("M2G_KUEUE_CONTROLLER", "many")
    with pytest.raises(UserError, match="M2G_KUEUE_CONTROLLER"):
        kueue.config(tmp_path, tmp_path, PORTS)
