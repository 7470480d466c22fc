"""The installed wheel works away from the checkout: templates and example policies are package
data, the entry points exist, the version has one source; optional extras fail cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import m2g
from m2g.policy.errors import EngineUnavailable
from m2g.policy.runtime import CEL_PYTHON, make_runtime
from m2g.templates import WorkloadApi, loader, render

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout (no network: the dev venv has setuptools)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, cwd=out)
    (found,) = out.glob("m2g-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the wheel installed; its dependencies come from the dev venv
    through a .pth file (no network), which does not expose the checkout's editable m2g."""
    where = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where / "v")], check=True)
    python = where / "v" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    site = subprocess.run([str(python), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "zz-m2g-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return where / "v" / "bin"


def run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (loader.ENV_DIR, "KUBECONFIG")}
    env["KUBECONFIG"] = str(cwd / "no-such-kubeconfig")
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def test_wheel_carries_templates_policies_license_and_entry_points(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("m2g/_shipped/") for n in names if n.startswith("m2g/_shipped/")}
    want = {f"templates/{p.name}" for p in (ROOT / "templates").glob("*.yaml")}
    want |= {f"policies/{p.relative_to(ROOT / 'policies')}"
             for p in (ROOT / "policies").rglob("*.yaml")}
    assert shipped == want
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "m2g = m2g_cli.app:main" in text
    assert "kubectl-m2g = m2g_cli.app:kubectl_main" in text
    assert not any(n.startswith(("tests/", "kind-e2e/")) for n in names)


def test_installed_wheel_lists_and_renders_every_template_outside_the_checkout(
        venv: Path, tmp_path: Path) -> None:
    where = run(venv, "python", "-c", "import m2g; print(m2g.__file__)", cwd=tmp_path)
    assert where.stdout.startswith(str(venv.parent)), where.stdout
    listed = run(venv, "m2g", "templates", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    names = sorted(loader.load_all(ROOT / "templates"))
    assert names and all(name in listed.stdout for name in names)
    shown = run(venv, "m2g", "templates", "show", names[0], cwd=tmp_path)
    assert shown.returncode == 0 and names[0] in shown.stdout, shown.stderr
    for name in names:  # rendered to manifests; no cluster, so no decision (one note line)
        dry = run(venv, "m2g", "submit", name, "--dry-run", "-o", "json", cwd=tmp_path)
        assert dry.returncode == 0, (name, dry.stderr)
        assert '"kind"' in dry.stdout and "Traceback" not in dry.stderr


def test_installed_wheel_renders_every_jobset_template_outside_the_checkout(
        venv: Path, tmp_path: Path) -> None:
    """As the JobSet the e2e suite runs (``--set api=JobSet``): one JobSet, queued in Kueue,
    whose replicated jobs hold every GPU the template asks for."""
    templates = loader.load_all(ROOT / "templates")
    names = sorted(n for n, t in templates.items() if WorkloadApi.JOBSET in t.spec.apis)
    assert names  # a moved folder or a dropped API would make the loop below vacuous
    for name in names:
        dry = run(venv, "m2g", "submit", name, "--set", "api=JobSet", "--dry-run", "-o", "json",
                  cwd=tmp_path)
        assert dry.returncode == 0, (name, dry.stderr)
        (obj,) = [o for o in json.loads(dry.stdout)["items"] if o["kind"] == "JobSet"]
        assert obj["apiVersion"] == "jobset.x-k8s.io/v1alpha2", name
        assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], name
        gpus = sum(int(r["replicas"]) * int(r["template"]["spec"].get("parallelism", 1))
                   * sum(int(c["resources"]["limits"].get("nvidia.com/gpu", 0))
                         for c in r["template"]["spec"]["template"]["spec"]["containers"])
                   for r in obj["spec"]["replicatedJobs"])
        assert gpus == render(templates[name], {"api": "JobSet"}).sizing.gpus, name


def test_installed_wheel_runs_the_example_policy_tests(venv: Path, tmp_path: Path) -> None:
    folder = run(venv, "m2g", "policy", "examples", cwd=tmp_path)
    assert folder.returncode == 0 and folder.stdout.strip().startswith(str(venv.parent))
    tested = run(venv, "m2g", "policy", "test", folder.stdout.strip(), cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert " 0 failed" in tested.stdout
    copied = run(venv, "m2g", "policy", "examples", str(tmp_path / "mine"), cwd=tmp_path)
    assert copied.returncode == 0 and (tmp_path / "mine" / "thermal" / "admission.yaml").is_file()
    again = run(venv, "m2g", "policy", "examples", str(tmp_path / "mine"), cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.count("\n") == 1


def test_version_flag_short_help_and_the_kubectl_plugin(venv: Path, tmp_path: Path) -> None:
    assert run(venv, "m2g", "--version", cwd=tmp_path).stdout == f"m2g {m2g.__version__}\n"
    short = run(venv, "m2g", "templates", "list", "-h", cwd=tmp_path)
    assert short.returncode == 0 and "--templates-dir" in short.stdout
    plugin = run(venv, "kubectl-m2g", "-h", cwd=tmp_path)
    assert plugin.returncode == 0 and "kubectl m2g" in plugin.stdout


def test_the_version_has_one_source() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert metadata.version("m2g") == m2g.__version__


def test_cel_python_is_an_extra_with_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith(("cel-python", "cryptography")) for d in deps["dependencies"])
    assert "cel-python" in deps["optional-dependencies"]
    monkeypatch.setitem(sys.modules, "celpy", None)  # import celpy now raises ImportError
    with pytest.raises(EngineUnavailable, match=r"pip install 'm2g\[cel-python\]'"):
        make_runtime(CEL_PYTHON)
