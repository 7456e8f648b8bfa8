"""GPU specs: dense datasheet figures, only the precisions a GPU has, NVML names resolved."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from schemas.gpus import DEFAULT_PRECISION, PRECISIONS, SPECS, GpuSpec, model_key, peak_tflops, spec_for

REQUIRED = ("H200-SXM", "H100-SXM", "H100-PCIe", "A100-SXM-40GB", "A100-SXM-80GB", "A100-PCIe-40GB",
            "A100-PCIe-80GB", "L40S", "L4", "A10G", "T4", "V100-SXM2-32GB", "V100-PCIe-16GB")


def test_constants() -> None:
    assert PRECISIONS == ("fp64", "tf32", "bf16", "fp16", "fp8", "int8")
    assert DEFAULT_PRECISION == "bf16"


def test_every_required_model_is_there_under_its_canonical_name() -> None:
    for model in REQUIRED:
        assert SPECS[model].model == model
    assert all(name == spec.model for name, spec in SPECS.items())


@pytest.mark.parametrize("spec", list(SPECS.values()), ids=list(SPECS))
def test_every_spec_is_complete_and_sane(spec: GpuSpec) -> None:
    assert spec.peak_tflops and set(spec.peak_tflops) <= set(PRECISIONS)
    assert all(type(v) is float and v > 0 for v in spec.peak_tflops.values())
    assert 50 <= spec.tdp_w <= 1000 and 16 <= spec.memory_gib <= 200
    assert spec.pcie_gb_s in (16.0, 32.0, 64.0)
    assert spec.source and ("datasheet" in spec.source or "unverified" in spec.source)
    # Same tensor rate for both 16-bit formats wherever the GPU has both.
    if {"bf16", "fp16"} <= spec.peak_tflops.keys():
        assert spec.peak_tflops["bf16"] == spec.peak_tflops["fp16"]
    # Lower precisions are never slower than higher ones on the same tensor cores.
    ordered = [spec.peak_tflops[p] for p in ("tf32", "fp16", "fp8") if p in spec.peak_tflops]
    assert ordered == sorted(ordered)


@pytest.mark.parametrize(("model", "has", "lacks"), [
    ("H100-SXM", set(PRECISIONS), set()),
    ("H200-SXM", set(PRECISIONS), set()),
    ("A100-SXM-80GB", {"fp64", "tf32", "bf16", "fp16", "int8"}, {"fp8"}),
    ("A100-PCIe-40GB", {"fp64", "tf32", "bf16", "fp16", "int8"}, {"fp8"}),
    ("L40S", {"tf32", "bf16", "fp16", "fp8", "int8"}, {"fp64"}),
    ("L4", {"tf32", "bf16", "fp16", "fp8", "int8"}, {"fp64"}),
    ("A10G", {"tf32", "bf16", "fp16", "int8"}, {"fp8", "fp64"}),
    ("T4", {"fp16", "int8"}, {"tf32", "bf16", "fp8", "fp64"}),
    ("V100-SXM2-32GB", {"fp64", "fp16"}, {"tf32", "bf16", "fp8", "int8"}),
])
def test_only_the_precisions_the_gpu_has(model: str, has: set[str], lacks: set[str]) -> None:
    assert set(SPECS[model].peak_tflops) == has
    for p in lacks:
        assert peak_tflops(SPECS[model], p) is None


@pytest.mark.parametrize(("model", "precision", "dense"), [
    # Half the datasheets' starred (sparse) figures.
    ("H100-SXM", "tf32", 494.5), ("H100-SXM", "bf16", 989.5), ("H100-SXM", "fp8", 1979.0),
    ("H100-SXM", "int8", 1979.0), ("H100-SXM", "fp64", 67.0), ("H100-PCIe", "bf16", 756.5),
    ("H200-SXM", "fp8", 1979.0), ("A100-SXM-80GB", "tf32", 156.0), ("A100-PCIe-40GB", "fp16", 312.0),
    ("A100-SXM-40GB", "int8", 624.0), ("L40S", "fp8", 733.0), ("L4", "fp8", 242.5), ("L4", "bf16", 121.0),
    # Turing and Volta have no sparsity: their figures are dense as printed.
    ("T4", "fp16", 65.0), ("T4", "int8", 130.0), ("V100-SXM2-16GB", "fp16", 125.0), ("V100-PCIe-32GB", "fp16", 112.0),
])
def test_dense_figures(model: str, precision: str, dense: float) -> None:
    assert peak_tflops(SPECS[model], precision) == dense


def test_power_memory_and_host_link() -> None:
    h100, pcie, a100_pcie40, t4, l4, h200 = (SPECS[m] for m in ("H100-SXM", "H100-PCIe", "A100-PCIe-40GB", "T4",
                                                                 "L4", "H200-SXM"))
    assert (h100.tdp_w, h100.memory_gib, h100.pcie_gb_s) == (700, 80, 64)
    assert (pcie.tdp_w, pcie.pcie_gb_s) == (350, 64)
    assert (a100_pcie40.tdp_w, a100_pcie40.memory_gib, a100_pcie40.pcie_gb_s) == (250, 40, 32)
    assert (t4.tdp_w, t4.memory_gib, t4.pcie_gb_s) == (70, 16, 16)
    assert (l4.tdp_w, h200.memory_gib) == (72, 141)
    assert SPECS["A100-SXM-80GB"].memory_gib == 80 and SPECS["A100-SXM-40GB"].memory_gib == 40


@pytest.mark.parametrize(("name", "model"), [
    ("NVIDIA H200", "H200-SXM"), ("NVIDIA H200 NVL", "H200-NVL"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"), ("NVIDIA A100-SXM4-40GB", "A100-SXM-40GB"),
    ("A100-SXM4-40GB", "A100-SXM-40GB"),  # older drivers: no vendor prefix
    ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"), ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"), ("NVIDIA A10G", "A10G"), ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"), ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
    ("Tesla V100-PCIE-16GB", "V100-PCIe-16GB"), ("Tesla V100-PCIE-32GB", "V100-PCIe-32GB"),
])
def test_nvml_product_names(name: str, model: str) -> None:
    spec = spec_for(name)
    assert spec is not None and spec.model == model


@pytest.mark.parametrize(("name", "model"), [
    ("H200", "H200-SXM"), ("H100", "H100-SXM"), ("A100", "A100-SXM-80GB"), ("V100", "V100-SXM2-32GB"),
    ("h100-sxm", "H100-SXM"), ("  H100-pcie ", "H100-PCIe"), ("a100_pcie_80gb", "A100-PCIe-80GB"),
    ("l40s", "L40S"), ("nvidia h100 80gb hbm3", "H100-SXM"),
])
def test_short_aliases_and_case_insensitive_names(name: str, model: str) -> None:
    spec = spec_for(name)
    assert spec is not None and spec.model == model


def test_every_canonical_name_resolves_to_itself() -> None:
    for name, spec in SPECS.items():
        assert spec_for(name) is spec
        assert spec_for(name.lower()) is spec


@pytest.mark.parametrize("name", ["", "   ", "NVIDIA B200", "H100-SXN", "A100-SXM", "NVIDIA GeForce RTX 4090",
                                  "NVIDIA A100-SXM4-40GB MIG 1g.5gb"])  # a MIG slice has a fraction of the peak
def test_unknown_names_are_none(name: str) -> None:
    assert spec_for(name) is None


def test_model_key_normalises_case_separators_and_vendor() -> None:
    assert model_key("nvidia  H100_80GB-HBM3") == "H100-80GB-HBM3"
    assert model_key("Tesla V100-SXM2-32GB") == "V100-SXM2-32GB"
    assert model_key("H100-PCIe") == model_key("NVIDIA H100 PCIe")


def test_peak_tflops_precision_spelling_and_default() -> None:
    h100 = SPECS["H100-SXM"]
    assert peak_tflops(h100, "BF16") == peak_tflops(h100, " bf16 ") == 989.5
    assert peak_tflops(h100, "") == peak_tflops(h100, DEFAULT_PRECISION)
    assert peak_tflops(h100, "fp4") is None and peak_tflops(h100, "fp32") is None


def test_peak_tflops_fp16_falls_back_to_bf16_but_not_the_other_way() -> None:
    only_bf16 = GpuSpec("X", {"bf16": 400.0}, 300, 48, 32, "mine")
    only_fp16 = GpuSpec("Y", {"fp16": 100.0}, 300, 48, 32, "mine")
    assert peak_tflops(only_bf16, "fp16") == 400.0
    assert peak_tflops(only_fp16, "bf16") is None  # a GPU with FP16 only (T4, V100) has no BF16
    assert peak_tflops(SPECS["T4"], "bf16") is None and peak_tflops(SPECS["V100-SXM2-32GB"], "") is None


def test_spec_is_frozen_and_its_figures_read_only() -> None:
    src = {"bf16": 1.0}
    spec = GpuSpec("X", src, 1, 1, 1, "s")
    src["bf16"] = 2.0
    assert spec.peak_tflops["bf16"] == 1.0  # a copy, not the caller's dict
    with pytest.raises(TypeError):
        spec.peak_tflops["bf16"] = 3.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.tdp_w = 5  # type: ignore[misc]
    assert spec == GpuSpec("X", {"bf16": 1.0}, 1.0, 1.0, 1.0, "s")
    assert type(spec.tdp_w) is float


@pytest.mark.parametrize(("peak", "tdp", "match"), [
    ({"fp4": 1.0}, 1.0, "unknown precision"), ({"bf16": 0.0}, 1.0, "bf16"), ({"bf16": -1.0}, 1.0, "bf16"),
    ({"bf16": float("nan")}, 1.0, "bf16"), ({"bf16": 1.0}, 0.0, "tdp_w"), ({"bf16": 1.0}, float("inf"), "tdp_w"),
])
def test_spec_rejects_bad_figures(peak: dict[str, float], tdp: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GpuSpec("X", peak, tdp, 1, 1, "s")


def test_schemas_stay_free_of_io_dependencies() -> None:
    code = ("import sys, schemas.gpus, schemas.pricebook; "
            "print(sorted(m for m in ('faust', 'aiokafka', 'confluent_kafka', 'pynvml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
