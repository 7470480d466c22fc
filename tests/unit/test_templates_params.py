"""--set parsing and validation, and template files that must not load; one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from m2g.templates import TemplateError, parse_sets, render, resolve
from m2g.templates.loader import find, load_all, load_file
from tests.unit.templates_helpers import TEMPLATES, shipped

FT = "llama31-8b-finetune"


def values(name: str, *items: str):  # type: ignore[no-untyped-def]
    return resolve(shipped()[name], parse_sets(items))


def test_defaults_come_from_the_template_then_the_catalogue() -> None:
    v = values(FT)
    assert (v.name, v.api, v.dp, v.tp, v.flex_tier, v.priority) == (
        FT, "PyTorchJob", 8, 1, 2, "m2g-fine-tuning")
    assert v.scheduler == "kai" and v.nvlink_level == "nvidia.com/gpu.clique"


def test_set_overrides_and_the_last_one_wins() -> None:
    v = values(FT, "dp=4", "dp=16", "api=JobSet", "image=reg/x:1", "name=ft-1")
    assert (v.dp, v.api, v.image, v.name) == (16, "JobSet", "reg/x:1", "ft-1")


@pytest.mark.parametrize(("item", "message"), [
    ("tp", "--set expects key=value, got 'tp'"),
    ("=3", "--set expects key=value, got '=3'"),
    ("tp=eight", f"{FT}: tp must be an integer, got 'eight'"),
    ("tp=16", f"{FT}: tp=16 is out of range [1, 8]"),
    ("flex_tier=4", f"{FT}: flex_tier=4 is out of range [0, 3]"),
    ("precision=fp16", f"{FT}: precision must be one of bf16, fp8, got 'fp16'"),
    ("api=LeaderWorkerSet", f"{FT}: api must be one of PyTorchJob, JobSet, Job, TrainJob"),
    ("name=Bad_Name", f"{FT}: name 'Bad_Name' must be a DNS label"),
    ("replicas=2", f"{FT}: unknown parameter 'replicas' (parameters: api, block_gpus"),
    ("pp=2", f"{FT}: unknown parameter 'pp'"),
])
def test_bad_set_is_one_clear_line(item: str, message: str) -> None:
    with pytest.raises(TemplateError) as err:
        values(FT, item)
    text = str(err.value)
    assert text.startswith(message)
    assert "\n" not in text


DIGEST = "sha256:" + "0" * 64


@pytest.mark.parametrize("image", [
    "nvcr.io/nvidia/pytorch:25.09-py3", "vllm/vllm-openai:v0.11.0", "localhost:5000/a/b:t",
    f"repo@{DIGEST}", f"ghcr.io/org/img:v1@{DIGEST}", "[::1]:5000/x", "a__b/c-d--e.f:T_1.2-x",
    "Registry.Example.COM:443/x",
])
def test_an_image_reference_is_read_as_the_runtime_reads_one(image: str) -> None:
    assert values(FT, f"image={image}").image == image


@pytest.mark.parametrize("image", [
    "UPPER/Repo", "repo:tag:tag", "repo@sha256:abc", "repo//x", "repo:", "a/b/", "repo:-tag",
    "repo:" + "t" * 129, "foo_/bar", "a" * 256, f"repo@{DIGEST}:tag", "repo@", "x:1@",
])
def test_an_image_the_runtime_cannot_parse_is_one_line(image: str) -> None:
    """Checked for its characters only, these rendered and were admitted: the pod never
    started (InvalidImageName) while its job held quota."""
    with pytest.raises(TemplateError) as err:
        values(FT, f"image={image}")
    assert str(err.value).startswith(f"{FT}: image ") and "is not an image reference" in \
        str(err.value) and "\n" not in str(err.value)


def test_empty_image_is_refused() -> None:
    with pytest.raises(TemplateError, match="image is empty"):
        render(shipped()[FT], {"image": ""})


def test_find_by_name_and_unknown_names() -> None:
    assert find(FT, TEMPLATES).name == FT
    with pytest.raises(TemplateError, match=r"no template 'nope' \(templates: agentic-coder"):
        find("nope", TEMPLATES)


GOOD = (TEMPLATES / "rack-benchmark.yaml").read_text()


def write(tmp: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("old", "new", "message"), [
    ("    dp: {default: 72", "    replicas: {default: 72", "parameters.replicas: does not apply "
     "to training templates"),
    ("    dp: {default: 72", "    bogus: {default: 72", "parameters.bogus: not a known parameter"),
    ("    dp: {default: 72, min: 1", "    dp: {default: 73, min: 1",
     "defaults do not render: rack-benchmark: dp=73 is out of range [1, 72]"),
    ('"--seq-length={seq_len}"', '"--seq-length={seqlen}"', "bad placeholder"),
    ("kwPerGpu: 1.34", "kwPerGpu: 9", "spec.power.kwPerGpu: Input should be less than or equal"),
    ("apis: [Job, JobSet, PyTorchJob]", "apis: [LeaderWorkerSet]", "serving templates render"),
    ("  name: rack-benchmark", "  name: Rack_Benchmark", "metadata.name: String should match"),
])
def test_broken_template_files_name_file_and_field(tmp_path: Path, old: str, new: str,
                                                   message: str) -> None:
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(TemplateError) as err:
        load_file(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)


def test_other_api_groups_are_skipped_and_duplicates_refused(tmp_path: Path) -> None:
    write(tmp_path, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "cm.yaml")
    write(tmp_path, GOOD, "a.yaml")
    assert list(load_all(tmp_path)) == ["rack-benchmark"]
    write(tmp_path, GOOD, "b.yaml")
    with pytest.raises(TemplateError, match="'rack-benchmark' is defined twice"):
        load_all(tmp_path)


def test_not_yaml_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match=r"t\.yaml: not YAML: "):
        load_file(write(tmp_path, "a: [\n"))
