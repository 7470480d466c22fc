"""``m2g templates list|show`` and ``m2g submit``: golden output, exit codes, one-line errors.

Regenerate the golden files after an intended change: ``M2G_UPDATE_GOLDEN=1 pytest
tests/unit/test_templates_cli.py`` (then review the diff).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from m2g_cli.app import app
from tests.unit.goldens import golden
from tests.unit.templates_helpers import TEMPLATES

POLICIES = Path(__file__).parents[2] / "policies"

runner = CliRunner()


@pytest.fixture(autouse=True)
def _templates_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The repo's templates, and no cluster: no kubeconfig anywhere, not in a pod."""
    monkeypatch.setenv("M2G_TEMPLATES", str(TEMPLATES))
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "M2G_PROMETHEUS_URL", "NO_COLOR"):
        monkeypatch.delenv(var, raising=False)


def run(*args: str, code: int = 0) -> tuple[str, str]:
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result.stdout, result.stderr


@pytest.mark.parametrize(("args", "name"), [
    (["templates", "list"], "templates_list.txt"),
    (["templates", "show", "llama31-405b-pretrain"], "templates_show_405b.txt"),
    (["templates", "show", "vllm-llama31-405b", "--set", "replicas=4", "--set", "tp=16"],
     "templates_show_vllm_tp16.txt"),
    (["submit", "rack-benchmark", "--dry-run", "-n", "bench", "--queue", "racks"],
     "submit_rack_benchmark.yaml.txt"),
])
def test_golden_output(args: list[str], name: str) -> None:
    out, err = run(*args)
    if args[0] == "submit":  # no cluster here: the admission decision is not evaluated
        assert err == ("note: no admission decision: no cluster: no kubeconfig ($KUBECONFIG, "
                       "~/.kube/config) and not running in a pod; pass --kubeconfig (pass "
                       "--policies DIR to evaluate without factory state)\n")
    else:
        assert err == ""
    golden(name, out)


def test_list_sorted_without_headers_and_as_a_list() -> None:
    """kubectl's habits on templates list: --sort-by a field of the -o json items,
    --no-headers, -o json|yaml a v1 List."""
    out, _ = run("templates", "list", "--sort-by", ".gpus", "--no-headers")
    golden("templates_list_no_headers_sort_gpus.txt", out)
    data = json.loads(run("templates", "list", "-o", "json", "--sort-by", "{.gpus}")[0])
    assert (data["apiVersion"], data["kind"]) == ("v1", "List")
    gpus = [i["gpus"] for i in data["items"]]
    assert gpus == sorted(gpus) and len(set(gpus)) > 1
    # one line per template, as kubectl prints rows (no wrapped description, no rule):
    # `--no-headers | awk '{print $1}'` gets the names and nothing else
    assert [line.split()[0] for line in out.splitlines()] == [i["name"] for i in data["items"]]
    docs = yaml.safe_load(run("templates", "list", "-o", "yaml")[0])
    assert [i["name"] for i in docs["items"]] == sorted(i["name"] for i in data["items"])
    out, err = run("templates", "list", "--sort-by", ".nope", code=2)
    assert out == "" and err.startswith("error: --sort-by '.nope': no such field in these "
                                        "items (fields: .name, .kind, .api, .gpus")
    assert err.count("\n") == 1


def test_submit_dry_run_evaluates_local_policies_without_a_cluster(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--policies without a cluster: the decision on an empty factory, said so in a note."""
    monkeypatch.chdir(POLICIES.parent)
    out, err = run("submit", "llama31-8b-finetune", "--dry-run", "-n", "research",
                   "--policies", "policies")
    assert yaml.safe_load(out)["kind"] == "PyTorchJob"
    golden("submit_offline_policies.stderr.txt", err)


def test_list_shows_every_template_once_with_default_gpus() -> None:
    out, _ = run("templates", "list")
    header, *lines = out.splitlines()
    assert header.split() == ["NAME", "KIND", "API", "GPUS", "FLEX", "DESCRIPTION"]
    rows = [line.split() for line in lines]
    by_name = {r[0]: r for r in rows}
    assert len(by_name) == len(rows)
    assert set(by_name) == {p.stem for p in TEMPLATES.glob("*.yaml")} - {
        "workload-priority-classes"}
    assert by_name["llama31-405b-pretrain"][1:5] == ["training", "JobSet", "512", "3"]


def test_show_reflects_set_values() -> None:
    out, _ = run("templates", "show", "llama31-405b-pretrain", "--set", "dp=16")
    assert "gpus         1024 = tp 4 x cp 2 x pp 8 x dp 16" in out
    assert "preferred network.topology.nvidia.com/block; slices of 16 pods required in nvidia.com/gpu.clique" in out


def test_submit_dry_run_json_is_a_list_with_the_queue() -> None:
    out, _ = run("submit", "llama31-70b-sft", "--dry-run", "-o", "json", "-q", "q1")
    doc = json.loads(out)
    assert doc["kind"] == "List" and doc["items"][0]["kind"] == "TrainJob"
    assert doc["items"][0]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q1"


def test_submit_notes_go_to_stderr_and_yaml_stays_clean() -> None:
    out, err = run("submit", "llama31-70b-sft", "--dry-run")
    assert err.startswith("note: TrainJob: the scheduler")
    assert "note: no admission decision: no cluster" in err
    assert yaml.safe_load(out)["kind"] == "TrainJob"


@pytest.mark.parametrize(("args", "message"), [
    (["templates", "show", "nope"], "error: no template 'nope' (templates: agentic-coder, "),
    (["submit", "rack-benchmark", "--set", "tp=9", "--dry-run"],
     "error: rack-benchmark: tp=9 is out of range [1, 8]"),
    (["submit", "rack-benchmark", "--set", "dp", "--dry-run"],
     "error: --set expects key=value, got 'dp'"),
    (["submit", "rack-benchmark", "--set", "color=blue", "--dry-run"],
     "error: rack-benchmark: unknown parameter 'color' (parameters: "),
    (["submit", "llama31-8b-finetune", "--set", "dp=6", "--dry-run"],
     "error: llama31-8b-finetune: tp*cp*pp*dp = 6 GPUs is not a whole number of 4-GPU trays"),
])
def test_user_mistakes_exit_2_with_one_line(args: list[str], message: str) -> None:
    out, err = run(*args, code=2)
    assert out == ""
    assert err.startswith(message) and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_bad_template_folder_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("apiVersion: m2g.io/v1alpha1\nkind: WorkloadTemplate\n")
    _, err = run("templates", "list", "--templates-dir", str(tmp_path), code=2)
    assert err.startswith(f"error: {tmp_path / 'x.yaml'}: metadata: Field required")


def test_submit_without_a_cluster_is_exit_1_with_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.kubeconfig"
    _, err = run("submit", "rack-benchmark", "--kubeconfig", str(missing), code=1)
    assert err.startswith("error: no cluster: kubeconfig: ") and err.count("\n") == 1, err


def test_submit_to_an_unreachable_server_is_exit_1(tmp_path: Path) -> None:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    _, err = run("submit", "llama31-8b-finetune", "--kubeconfig", str(cfg), code=1)
    assert err.startswith("error: no cluster: ") and err.count("\n") == 1, err


def test_kubectl_dry_run_strategies_are_m2g_flags(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from m2g_cli.app import kubectl_forms, main

    base = ["submit", "rack-benchmark", "-n", "bench", "--queue", "racks"]
    assert kubectl_forms([*base, "--dry-run=client"]) == [*base, "--dry-run"]
    assert kubectl_forms([*base, "--dry-run=SERVER"]) == [*base, "--server-dry-run"]
    assert kubectl_forms([*base, "--dry-run=none"]) == base
    assert kubectl_forms([*base, "--", "--dry-run=x"]) == [*base, "--", "--dry-run=x"]
    # through the console script: --dry-run=client is --dry-run; a bad strategy is one line
    monkeypatch.setattr("sys.argv", ["m2g", *base, "--dry-run=client"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    golden("submit_rack_benchmark.yaml.txt", out)  # the same manifests as --dry-run
    monkeypatch.setattr("sys.argv", ["m2g", *base, "--dry-run=clent"])
    with pytest.raises(SystemExit) as bad:
        main()
    assert bad.value.code == 2
    assert capsys.readouterr().err == ("error: --dry-run must be none, client or server, "
                                       "not 'clent'\n")
