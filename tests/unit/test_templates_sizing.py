"""Sizing: parameters → GPUs, pods, placement, memory per GPU, power, checkpoint size."""

from __future__ import annotations

import pytest

from m2g.templates import TemplateError, WorkloadTemplate, render, resolve, size
from m2g.templates.sizing import HBM_GB, USABLE_FRACTION
from tests.unit.templates_helpers import shipped

CLIQUE, BLOCK = "nvidia.com/gpu.clique", "network.topology.nvidia.com/block"


def sized(name: str, **sets: object):  # type: ignore[no-untyped-def]
    return render(shipped()[name], {k: str(v) for k, v in sets.items()}).sizing


def test_the_issue_asks_for_these_recipes() -> None:
    kinds = {t.name: t.spec.workload_kind.value for t in shipped().values()}
    assert kinds == {
        "llama31-8b-finetune": "fine-tuning", "llama31-70b-sft": "fine-tuning",
        "llama31-405b-pretrain": "training", "vllm-llama31-405b": "inference",
        "rack-benchmark": "benchmark", "batch-synthetic-data": "data-processing",
        "agentic-coder": "agentic",
    }


def test_405b_pretrain_defaults_fill_one_block_with_rack_sized_replicas() -> None:
    s = sized("llama31-405b-pretrain")
    assert (s.gpus, s.pods, s.gpus_per_pod, s.model_parallel) == (512, 128, 4, 64)
    assert s.placement.required == BLOCK and s.placement.preferred is None
    assert (s.placement.slice_level, s.placement.slice_pods) == (CLIQUE, 16)
    assert s.kw == pytest.approx(512 * 1.34, abs=0.1)
    assert s.checkpoint_gb == pytest.approx(405.9 * 14)
    assert s.warnings == ()


def test_405b_memory_per_gpu_follows_the_rules_of_thumb() -> None:
    m = sized("llama31-405b-pretrain").memory
    assert m is not None
    per_gpu = 405.9e9 / (4 * 8)  # tp * pp
    assert m.weights == pytest.approx(per_gpu * 2 / 1e9)
    assert m.gradients == pytest.approx(per_gpu * 4 / 1e9)
    assert m.optimizer == pytest.approx(per_gpu * 12 / (8 * 2) / 1e9)  # sharded over dp*cp
    assert m.activations == pytest.approx(34 * 8192 * 16384 * 126 / (4 * 2) / 1e9)
    assert m.total < HBM_GB * USABLE_FRACTION


def test_larger_than_a_block_is_only_preferred_at_block_level() -> None:
    p = sized("llama31-405b-pretrain", dp=16).placement
    assert (p.required, p.preferred, p.slice_pods) == (None, BLOCK, 16)


def test_block_size_is_a_parameter() -> None:
    assert sized("llama31-405b-pretrain", dp=16, block_gpus=1152).placement.required == BLOCK


def test_a_gang_within_one_nvlink_domain_requires_it() -> None:
    s = sized("llama31-8b-finetune")
    assert (s.gpus, s.pods, s.gpus_per_pod) == (8, 2, 4)
    assert s.placement.required == CLIQUE and s.placement.slice_pods is None
    bench = sized("rack-benchmark")
    assert (bench.gpus, bench.pods, bench.placement.required) == (72, 18, CLIQUE)


def test_less_than_a_tray_is_one_pod() -> None:
    s = sized("llama31-8b-finetune", dp=2)
    assert (s.gpus, s.pods, s.gpus_per_pod) == (2, 1, 2)


def test_a_replica_bigger_than_a_domain_slices_on_the_tensor_parallel_group() -> None:
    s = sized("llama31-405b-pretrain", tp=8, cp=1, pp=16, dp=4)
    assert (s.model_parallel, s.placement.slice_pods) == (128, 2)


@pytest.mark.parametrize(("name", "sets", "message"), [
    ("llama31-8b-finetune", {"dp": 6}, "6 GPUs is not a whole number of 4-GPU trays"),
    ("llama31-8b-finetune", {"tp": 3}, "tp=3 does not divide the model's 32 attention heads"),
    ("llama31-405b-pretrain", {"tp": 16, "cp": 8}, "tp*cp = 128 GPUs exceeds one NVLink"),
])
def test_impossible_layouts_are_errors(name: str, sets: dict[str, int], message: str) -> None:
    with pytest.raises(TemplateError, match=message.replace("*", r"\*")) as err:
        sized(name, **sets)
    assert str(err.value).startswith(f"{name}: ")


def test_a_serving_group_spans_trays_inside_one_domain() -> None:
    s = sized("vllm-llama31-405b", tp=16, pp=4)
    assert (s.gpus, s.pods, s.groups, s.placement.required) == (128, 16, 2, CLIQUE)


def test_memory_over_budget_is_a_warning_not_an_error() -> None:
    s = sized("llama31-405b-pretrain", tp=1, cp=1, pp=1, dp=4)
    assert any("exceeds the 259 GB budget" in w for w in s.warnings)


def test_uneven_pipeline_split_is_a_warning() -> None:
    assert any("splits 126 layers unevenly" in w
               for w in sized("llama31-405b-pretrain", pp=5, dp=8).warnings)
    assert sized("llama31-405b-pretrain", pp=7).warnings == ()  # 126 = 7 * 18


def test_serving_sizes_groups_and_kv_cache() -> None:
    s = sized("vllm-llama31-405b")
    assert (s.gpus, s.pods, s.gpus_per_pod, s.groups) == (16, 2, 4, 2)
    m = s.memory
    assert m is not None
    assert m.weights == pytest.approx(405.9e9 / 8 / 1e9)  # FP8: one byte per parameter
    per_token = 2 * 126 * 8 * 128 * 1 / 8  # K and V, layers, KV heads, head dim, fp8, / tp
    assert m.kv_tokens == int((HBM_GB * USABLE_FRACTION - m.weights) * 1e9 / per_token)
    bf16 = sized("vllm-llama31-405b", precision="bf16").memory
    assert bf16 is not None and bf16.weights == pytest.approx(2 * m.weights)


def test_moe_experts_are_sharded_by_expert_parallelism() -> None:
    dense_like = sized("agentic-coder").memory
    assert dense_like is not None
    assert dense_like.weights == pytest.approx(480e9 / 8 / 1e9)
    per_token = 2 * 62 * 8 * 128 / 8  # Qwen3's explicit head_dim 128, not 6144 / 96
    assert dense_like.kv_tokens == int(dense_like.kv_cache * 1e9 / per_token)


def _bigger(params_b: float) -> WorkloadTemplate:
    t = shipped()["vllm-llama31-405b"]
    assert t.spec.model is not None
    model = t.spec.model.model_copy(update={"parameters_b": params_b})
    return t.model_copy(update={"spec": t.spec.model_copy(update={"model": model})})


def test_too_little_memory_for_weights_or_one_sequence_warns() -> None:
    v = resolve(_bigger(2500), {"tp": "8", "precision": "bf16"})
    warnings = size(_bigger(2500), v).warnings
    assert any("weights alone (625 GB per GPU) exceed" in w for w in warnings)
    v = resolve(_bigger(2060), {"tp": "8", "seq_len": "131072"})
    assert any("KV cache holds" in w for w in size(_bigger(2060), v).warnings)


def test_independent_workers_are_unconstrained() -> None:
    s = sized("batch-synthetic-data", workers=10, gpus_per_worker=2)
    assert (s.gpus, s.pods, s.gpus_per_pod, s.memory) == (20, 10, 2, None)
    assert s.placement.unconstrained and s.placement.required is None
    assert s.kw == pytest.approx(20 * 1.29)
