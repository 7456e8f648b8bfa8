"""The leaks a scenario can play (``kind = "leak"``): per rule of ``streams.leaks``, its magnitude's default,
how long a leak must last to be labelled ``alert``, and the look-alikes that must not fire.

>>> LEAK_VARIANTS["checkpoint_io_storm"]
('leak', 'state_changes')
"""

from __future__ import annotations

from typing import Final

# Each leak rule: its default magnitude (in the rule's own unit), how long a leak must last to be
# labelled "alert" (the rule's documented delay with margin), and its look-alikes.
LEAK_MAGNITUDES: Final[dict[str, float]] = {
    "idle_allocated": 0.0, "pipeline_stall": 600.0,  # dataloader wait, ms
    "batching_collapse": 43.0,  # queue depth at the cliff (the seed's table)
    "nccl_retransmit_storm": 2.0,  # extra retransmits per second
    "nccl_slow_allreduce": 3.0,  # AllReduce time x this
    "memory_fragmentation": 240.0,  # MiB a minute the driver gap grows
    "checkpoint_io_storm": 2.4e9,  # bytes per checkpoint (the seed's 2.4 GB)
}
LEAK_MIN_S: Final[dict[str, float]] = {
    "idle_allocated": 630.0, "pipeline_stall": 90.0, "batching_collapse": 90.0, "nccl_retransmit_storm": 120.0,
    "nccl_slow_allreduce": 120.0, "memory_fragmentation": 600.0, "checkpoint_io_storm": 420.0,
}
LEAK_VARIANTS: Final[dict[str, tuple[str, ...]]] = {
    "idle_allocated": ("leak", "warmup", "unallocated"), "pipeline_stall": ("leak", "short"),
    "batching_collapse": ("leak", "load_growth"), "nccl_retransmit_storm": ("leak", "variance"),
    "nccl_slow_allreduce": ("leak", "one_off"), "memory_fragmentation": ("leak", "warmup_growth", "flat_cache"),
    "checkpoint_io_storm": ("leak", "state_changes"),
}
