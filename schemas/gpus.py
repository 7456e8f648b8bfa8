"""GPU specs: peak dense TFLOP/s per precision, TDP, memory and host link, from vendor datasheets.

NVIDIA's datasheets mark sparse figures with an asterisk; every figure here is dense (half
the sparse one), since the activity counters that scale it (tensor_active, sm_active) say
nothing about sparsity. ``int8`` holds TOPS. A precision is listed only where the GPU has it
and the datasheet gives a figure.

>>> spec_for("NVIDIA H100 80GB HBM3").model
'H100-SXM'
>>> spec_for("a100").model, spec_for("Tesla T4").model
('A100-SXM-80GB', 'T4')
>>> peak_tflops(SPECS["H100-SXM"], "bf16"), peak_tflops(SPECS["T4"], "bf16")
(989.5, None)
>>> spec_for("NVIDIA B9000") is None
True
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

PRECISIONS: Final = ("fp64", "tf32", "bf16", "fp16", "fp8", "int8")
DEFAULT_PRECISION: Final = "bf16"


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model. ``peak_tflops`` is dense, per precision the GPU has (``int8``: TOPS)."""

    model: str
    peak_tflops: Mapping[str, float]
    tdp_w: float
    memory_gib: float
    pcie_gb_s: float  # host link, per direction: Gen5 x16 = 64, Gen4 x16 = 32, Gen3 x16 = 16
    source: str

    def __post_init__(self) -> None:
        unknown = sorted(set(self.peak_tflops) - set(PRECISIONS))
        if unknown:
            raise ValueError(f"{self.model}: unknown precision(s) {', '.join(unknown)}; "
                             f"expected {', '.join(PRECISIONS)}")
        for name, value in (*self.peak_tflops.items(), ("tdp_w", self.tdp_w), ("memory_gib", self.memory_gib),
                            ("pcie_gb_s", self.pcie_gb_s)):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{self.model}: {name} = {value!r} must be a positive number")
        # A read-only copy, floats only: a spec is shared by every frame of its model.
        object.__setattr__(self, "peak_tflops", MappingProxyType({k: float(v) for k, v in self.peak_tflops.items()}))
        for name in ("tdp_w", "memory_gib", "pcie_gb_s"):
            object.__setattr__(self, name, float(getattr(self, name)))


def _spec(model: str, tdp_w: float, memory_gib: float, pcie_gb_s: float, source: str,
          **peak: float) -> GpuSpec:
    return GpuSpec(model, peak, tdp_w, memory_gib, pcie_gb_s, source)


# fp64 is the FP64 Tensor Core figure where the GPU has one (Hopper, Ampere A100), else the
# vector figure (V100); GPUs whose datasheet gives no fp64 figure (L40S, L4, A10G, T4) have none.
# memory_gib is the datasheet's "GB": NVIDIA's HBM capacities are binary (80 GB = 5 x 16 GiB).
_HOPPER = "NVIDIA H100 Tensor Core GPU datasheet (2023), nvidia.com/en-us/data-center/h100"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), nvidia.com/en-us/data-center/h200"
_AMPERE = "NVIDIA A100 Tensor Core GPU datasheet (2021), nvidia.com/en-us/data-center/a100"
_SPECS: Final = (
    # H200 datasheet, SXM column: TF32 989*, BF16/FP16 1,979*, FP8/INT8 3,958*; 141 GB; up to 700 W.
    _spec("H200-SXM", 700, 141, 64, _H200, fp64=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979),
    # H200 datasheet, NVL column: TF32 835*, BF16/FP16 1,671*, FP8/INT8 3,341*; up to 600 W.
    _spec("H200-NVL", 600, 141, 64, _H200, fp64=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5,
          int8=1670.5),
    # H100 datasheet, SXM column: FP64 Tensor 67, TF32 989*, BF16/FP16 1,979*, FP8/INT8 3,958*; 700 W.
    _spec("H100-SXM", 700, 80, 64, _HOPPER, fp64=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979),
    # H100 datasheet, PCIe column: FP64 Tensor 51, TF32 756*, BF16/FP16 1,513*, FP8/INT8 3,026*; 350 W.
    _spec("H100-PCIe", 350, 80, 64, _HOPPER, fp64=51, tf32=378, bf16=756.5, fp16=756.5, fp8=1513, int8=1513),
    # H100 datasheet, NVL column: FP64 Tensor 60, TF32 835*, BF16/FP16 1,671*, FP8/INT8 3,341*; 94 GB; 400 W.
    _spec("H100-NVL", 400, 94, 64, _HOPPER, fp64=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5,
          int8=1670.5),
    # A100 datasheet: every A100 has FP64 Tensor 19.5, TF32 312*, BF16/FP16 624*, INT8 1,248* TOPS;
    # they differ in power (SXM 400 W; PCIe 40GB 250 W, 80GB 300 W) and memory.
    _spec("A100-SXM-80GB", 400, 80, 32, _AMPERE, fp64=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _spec("A100-SXM-40GB", 400, 40, 32, _AMPERE, fp64=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _spec("A100-PCIe-80GB", 300, 80, 32, _AMPERE, fp64=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _spec("A100-PCIe-40GB", 250, 40, 32, _AMPERE, fp64=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    # L40S datasheet (2023), which prints dense | sparse: TF32 183 | 366*, BF16/FP16 362.05 | 733*,
    # FP8 733 | 1,466*, INT8 733 | 1,466* TOPS; 48 GB; 350 W.
    _spec("L40S", 350, 48, 32, "NVIDIA L40S GPU datasheet (2023), nvidia.com/en-us/data-center/l40s",
          tf32=183, bf16=362.05, fp16=362.05, fp8=733, int8=733),
    # L4 datasheet (2023): TF32 120*, BF16/FP16 242*, FP8/INT8 485*; 24 GB; 72 W.
    _spec("L4", 72, 24, 32, "NVIDIA L4 Tensor Core GPU datasheet (2023), nvidia.com/en-us/data-center/l4",
          tf32=60, bf16=121, fp16=121, fp8=242.5, int8=242.5),
    # NVIDIA publishes no A10G datasheet (an AWS-only GA102 part, EC2 G5), so these are the figures
    # quoted to G5 users, NOT verified against a datasheet: TF32 35, BF16/FP16 70, INT8 140 TOPS,
    # dense (the A10 datasheet's 125 FP16 is a different part), 24 GB, 300 W board limit.
    # A price book's [gpus.A10G] table overrides them.
    _spec("A10G", 300, 24, 32, "AWS EC2 G5 (NVIDIA A10G), 2021; no NVIDIA datasheet, unverified",
          tf32=35, bf16=70, fp16=70, int8=140),
    # T4 datasheet (2019): mixed-precision FP16/FP32 65, INT8 130 TOPS (Turing has no sparsity:
    # these are dense); 16 GB; 70 W; PCIe Gen3. No TF32, BF16 or FP8 on Turing.
    _spec("T4", 70, 16, 16, "NVIDIA T4 Tensor Core GPU datasheet (2019), nvidia.com/en-us/data-center/tesla-t4",
          fp16=65, int8=130),
    # V100 datasheet (2018): SXM2 FP64 7.8, Tensor (FP16) 125, 300 W; PCIe FP64 7, Tensor 112,
    # 250 W; PCIe Gen3. Volta has no TF32, BF16, FP8 or INT8 tensor cores, and no sparsity.
    *(_spec(f"V100-{form}-{gib}GB", tdp, gib, 16, "NVIDIA Tesla V100 GPU accelerator datasheet (2018), "
            "nvidia.com/en-us/data-center/v100", fp64=fp64, fp16=fp16)
      for form, tdp, fp64, fp16 in (("SXM2", 300, 7.8, 125), ("PCIe", 250, 7, 112)) for gib in (32, 16)),
)
SPECS: Final[Mapping[str, GpuSpec]] = MappingProxyType({s.model: s for s in _SPECS})

# Names other than the canonical ones: what NVML's nvmlDeviceGetName reports, and short forms.
# A short name means the part most clouds rent under it (H100: SXM; A100: SXM 80GB).
_ALIASES: Final = {
    "H200": "H200-SXM", "NVIDIA H200": "H200-SXM", "NVIDIA H200 NVL": "H200-NVL",
    "H100": "H100-SXM", "NVIDIA H100 80GB HBM3": "H100-SXM", "H100-SXM5": "H100-SXM", "H100-SXM5-80GB": "H100-SXM",
    "NVIDIA H100 PCIe": "H100-PCIe", "NVIDIA H100 NVL": "H100-NVL",
    "A100": "A100-SXM-80GB", "NVIDIA A100-SXM4-80GB": "A100-SXM-80GB", "NVIDIA A100-SXM4-40GB": "A100-SXM-40GB",
    "NVIDIA A100 80GB PCIe": "A100-PCIe-80GB", "NVIDIA A100-PCIE-80GB": "A100-PCIe-80GB",
    "NVIDIA A100-PCIE-40GB": "A100-PCIe-40GB",
    "NVIDIA L40S": "L40S", "NVIDIA L4": "L4", "NVIDIA A10G": "A10G", "Tesla T4": "T4",
    "V100": "V100-SXM2-32GB", "Tesla V100-SXM2-32GB": "V100-SXM2-32GB", "Tesla V100-SXM2-16GB": "V100-SXM2-16GB",
    "Tesla V100-PCIE-32GB": "V100-PCIe-32GB", "Tesla V100-PCIE-16GB": "V100-PCIe-16GB",
}
_VENDOR_PREFIX: Final = re.compile(r"^(NVIDIA|TESLA)-")


@functools.lru_cache(maxsize=1024)  # asked per GPU frame (link and price lookups); a cluster has a few models
def model_key(gpu_model: str) -> str:
    """The spelling-insensitive form names are matched on: upper case, ``-`` for spaces and ``_``,
    no vendor prefix (older drivers report ``A100-SXM4-40GB``, newer ``NVIDIA A100-SXM4-40GB``).

    >>> model_key(" NVIDIA h100_80GB  HBM3"), model_key("Tesla T4")
    ('H100-80GB-HBM3', 'T4')
    """
    key = re.sub(r"[\s_-]+", "-", gpu_model.strip().upper())
    return _VENDOR_PREFIX.sub("", key)


def _index() -> dict[str, str]:
    index = {model_key(name): name for name in SPECS}
    for alias, model in _ALIASES.items():
        if model not in SPECS:
            raise ValueError(f"alias {alias!r} names {model!r}, which is not in SPECS")
        index.setdefault(model_key(alias), model)
    return index


_BY_KEY: Final = _index()


def spec_for(gpu_model: str) -> GpuSpec | None:
    """The spec of a canonical name, an NVML product name or a short alias; None when unknown.

    No guessing beyond that: a MIG slice (``NVIDIA A100-SXM4-40GB MIG 1g.5gb``) has a fraction
    of the GPU's peak, so it is unknown rather than given the whole GPU's figures.
    """
    model = _BY_KEY.get(model_key(gpu_model))
    return None if model is None else SPECS[model]


def peak_tflops(spec: GpuSpec, precision: str) -> float | None:
    """Peak dense TFLOP/s (TOPS for int8) of ``spec`` at ``precision``; None where the GPU lacks it.

    ``precision`` is matched case-insensitively; empty means DEFAULT_PRECISION. One fallback:
    fp16 missing but bf16 given answers the bf16 figure, since every GPU with BF16 tensor cores
    runs FP16 at the same rate (a custom spec may list only one). Not the other way round: T4 and
    V100 have FP16 but no BF16, so bf16 there is None rather than a borrowed figure.

    >>> custom = GpuSpec("X", {"bf16": 400.0}, 300, 48, 32, "mine")
    >>> peak_tflops(custom, "FP16"), peak_tflops(custom, ""), peak_tflops(custom, "fp8")
    (400.0, 400.0, None)
    """
    p = precision.strip().lower() or DEFAULT_PRECISION
    got = spec.peak_tflops.get(p)
    if got is None and p == "fp16":
        got = spec.peak_tflops.get("bf16")
    return got
