"""Thresholds and windows of the leak detectors, with the seeds' numbers as defaults.

A policy file (TOML, ``FLOPWATCH_LEAK_POLICY``) overrides any of them, one table per rule; parsing
is strict, so a misspelt rule or key is an error naming the file and the key::

    [leaks.idle_allocated]
    idle_s = 1800                 # a held GPU doing nothing for 30 minutes, not 10
    [leaks.nccl_retransmit_storm]
    enabled = false

>>> p = parse_leak_policy({"leaks": {"idle_allocated": {"idle_s": 1800}}}, "leaks.toml")
>>> p.idle_allocated.idle_s, p.pipeline_stall.wait_ms
(1800.0, 100.0)
>>> try:
...     parse_leak_policy({"leaks": {"idle": {}}}, "leaks.toml")
... except PolicyError as exc:
...     print(str(exc)[:45])
leaks.toml: [leaks] has no key 'idle' (known:
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from schemas.alerts import LEAK_RULES
from streams.policy.tables import PolicyError, build_section, check_keys, table

RULES: Final = LEAK_RULES


@dataclass(frozen=True, slots=True)
class FragmentationParams:
    """``memory_fragmentation`` (seed 000 §2.1): a memory gap far above normal that keeps growing."""

    enabled: bool = True
    slot_s: float = 10.0  # the series are averaged into slots of this length
    window_s: float = 600.0  # the growth is fitted over this much of the latest history ...
    min_span_s: float = 300.0  # ... once it covers this much ("growing over minutes")
    min_gap_mib: float = 2048.0  # a gap is far above normal from this size ...
    driver_ratio: float = 0.02  # ... and fb_used - torch_reserved >= this x torch_reserved
    allocator_ratio: float = 1.0  # ... or torch_reserved - torch_allocated >= this x torch_allocated
    min_growth_mib_per_min: float = 16.0  # the gap's robust slope, its whole 95% interval above 0
    clear_s: float = 120.0


@dataclass(frozen=True, slots=True)
class RetransmitParams:
    """``nccl_retransmit_storm`` (seed 000 §2.2: 2.4 against 0.3 retransmits per step, 8x)."""

    enabled: bool = True
    window_s: float = 60.0  # the rate now: retransmits within this window ...
    baseline_s: float = 900.0  # ... against the workload's own rate over this much clean history
    learn_s: float = 180.0  # no verdict before this much history
    factor: float = 4.0  # now >= factor x baseline ...
    min_count: float = 30.0  # ... and at least this many retransmits in the window (0.5/s) ...
    max_p: float = 1e-4  # ... and a Poisson tail this unlikely under the baseline rate
    min_base_per_s: float = 0.01  # a clean link's rate is floored here (a zero baseline makes any retry a storm)
    hold_s: float = 15.0
    clear_s: float = 60.0


@dataclass(frozen=True, slots=True)
class SlowAllreduceParams:
    """``nccl_slow_allreduce`` (seed 000 §2.2): lastingly far above the workload's own AllReduce time."""

    enabled: bool = True
    window_s: float = 30.0  # the median of the ticks' means in this window: one slow collective does not move it
    baseline_s: float = 900.0
    learn_s: float = 180.0
    factor: float = 2.0
    min_excess_ms: float = 2.0
    hold_s: float = 30.0
    clear_s: float = 30.0


@dataclass(frozen=True, slots=True)
class CheckpointParams:
    """``checkpoint_io_storm`` (seed 000 §2.3: 2.4 GB each time against 187 MB after the fix)."""

    enabled: bool = True
    burst_bytes_s: float = 200e6  # disk_write at or above this is a burst
    min_burst_bytes: float = 500e6  # a burst smaller than this is not a checkpoint worth a look
    bursts: int = 5  # judged over the latest this many bursts:
    # periodic: the intervals' coefficient of variation at most this (a timer's; a training loop's
    # checkpoints every 30-60 s, CV ~0.2, are not)
    max_period_cv: float = 0.08
    # the volume does not shrink: the same bytes each time (the volumes' coefficient of variation)
    max_volume_cv: float = 0.05
    max_state_change: float = 0.05  # the state (the node's torch_allocated) moved less than this between them
    idle_util_pct: float = 20.0  # the GPUs idle during a burst: their mean gpu_util at most this ...
    min_idle_share: float = 0.5  # ... for at least this share of the burst
    gap_s: float = 3.0  # a burst ends after this long below burst_bytes_s
    max_period_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class BatchingParams:
    """``batching_collapse`` (seed 000 §2.4: queue 2 -> 17 -> 43, utilisation 78% -> 32% -> <5%)."""

    enabled: bool = True
    window_s: float = 30.0
    baseline_s: float = 900.0
    learn_s: float = 120.0
    queue_factor: float = 4.0  # queue depth >= factor x its baseline ...
    min_queue_rise: float = 10.0  # ... and at least this many requests more
    util_ratio: float = 0.6  # gpu_util <= this x its baseline (the GPU does not keep up)
    latency_factor: float = 2.5  # request latency >= this x its baseline
    min_base_util_pct: float = 20.0  # a GPU that was never busy cannot collapse
    hold_s: float = 15.0
    clear_s: float = 30.0


@dataclass(frozen=True, slots=True)
class StallParams:
    """``pipeline_stall`` (seed 000 §2.5): the GPU waits on its input pipeline."""

    enabled: bool = True
    wait_ms: float = 100.0  # dataloader_wait_ms at or above this ...
    max_util_pct: float = 30.0  # ... while gpu_util is at most this: a stalled tick
    window_s: float = 60.0
    min_share: float = 0.5  # stalled ticks' share of the window
    carry_s: float = 10.0  # a step's wait covers the ticks after it until the next step (a blocked step reports late)
    hold_s: float = 10.0
    clear_s: float = 30.0


@dataclass(frozen=True, slots=True)
class IdleAllocatedParams:
    """``idle_allocated``: a pod holds a GPU that does no work."""

    enabled: bool = True
    idle_s: float = 600.0
    max_util_pct: float = 5.0
    max_activity: float = 0.05
    busy_pcie_bytes_s: float = 1e9  # host-to-device copies this fast are a warm-up loading weights, not idleness


@dataclass(frozen=True, slots=True)
class LeakParams:
    memory_fragmentation: FragmentationParams = field(default_factory=FragmentationParams)
    nccl_retransmit_storm: RetransmitParams = field(default_factory=RetransmitParams)
    nccl_slow_allreduce: SlowAllreduceParams = field(default_factory=SlowAllreduceParams)
    checkpoint_io_storm: CheckpointParams = field(default_factory=CheckpointParams)
    batching_collapse: BatchingParams = field(default_factory=BatchingParams)
    pipeline_stall: StallParams = field(default_factory=StallParams)
    idle_allocated: IdleAllocatedParams = field(default_factory=IdleAllocatedParams)


    def all_off(self) -> LeakParams:
        """These parameters with every rule turned off (drift and spikes alone, for comparisons)."""
        return dataclasses.replace(self, **{r: dataclasses.replace(getattr(self, r), enabled=False) for r in RULES})

    @property
    def any_enabled(self) -> bool:
        return any(getattr(self, r).enabled for r in RULES)

    def history_s(self) -> float:
        """Seconds of frames that rebuild every enabled rule's state after a restart: an episode that began
        within it gets the same onset, so the same alert id. (A checkpoint storm's bursts are its history:
        it is rebuilt when ``bursts`` of them fall within this.)"""
        need = [0.0]
        if self.idle_allocated.enabled:
            need.append(self.idle_allocated.idle_s)
        if self.memory_fragmentation.enabled:
            need.append(self.memory_fragmentation.window_s)
        for p in (self.nccl_retransmit_storm, self.nccl_slow_allreduce, self.batching_collapse):
            if p.enabled:
                need.append(p.baseline_s + p.window_s)
        if self.pipeline_stall.enabled:
            need.append(self.pipeline_stall.window_s + self.pipeline_stall.hold_s)
        return max(need) + 60.0


_POSITIVE: Final = frozenset({"slot_s", "window_s", "min_span_s", "baseline_s", "factor", "bursts", "gap_s",
                              "queue_factor", "latency_factor", "util_ratio", "max_period_s", "burst_bytes_s"})


def parse_leak_policy(obj: Mapping[str, Any], source: str) -> LeakParams:
    """``LeakParams`` from a parsed TOML document (its ``[leaks]`` table); ``source`` names it in errors."""
    check_keys(obj, {"leaks"}, source, "top level")
    tab = table(obj.get("leaks", {}), source, "[leaks]")
    check_keys(tab, set(RULES), source, "[leaks]")
    base = LeakParams()
    parts = {rule: build_section(type(getattr(base, rule)), t, source, f"[leaks.{rule}]", positive=_POSITIVE)
             for rule, t in tab.items()}
    out = dataclasses.replace(base, **parts)
    if out.checkpoint_io_storm.bursts < 3:
        raise PolicyError(f"{source}: [leaks.checkpoint_io_storm] bursts must be >= 3 (a period needs two intervals)")
    return out
