"""A fixed window of aligned history per GPU: the series attribution reads, as a numpy ring.

>>> w = SeriesWindow(ticks=4)
>>> for t in range(6):
...     w.push(t, {"gpu_util": float(t)}, {"disk_write": 10.0 * t}, flops_per_watt=None)
>>> times, block = w.ordered()
>>> times.tolist(), block[SERIES.index("gpu_util")].tolist(), block[SERIES.index("disk_write")].tolist()
([2, 3, 4, 5], [2.0, 3.0, 4.0, 5.0], [20.0, 30.0, 40.0, 50.0])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numpy as np

# What attribution may name: the GPU's sensors (value columns), its FLOPS/W (last), and its node's host series.
GPU_SERIES: Final = ("gpu_util", "sm_active", "tensor_active", "power", "temperature", "sm_clock", "fb_used",
                     "pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx", "ecc_errors", "xid_errors", "torch_allocated",
                     "torch_reserved", "nccl_allreduce_ms", "nccl_retries", "dataloader_wait_ms", "queue_depth",
                     "request_rate", "request_latency_ms", "flops_per_watt")
HOST_SERIES: Final = ("host_cpu_util", "disk_write")
_SAMPLED: Final = GPU_SERIES[:-1]  # the GPU's series its frame's values hold (FLOPS/W is derived)
SERIES: Final = GPU_SERIES + HOST_SERIES
_CHUNK: Final = 32


class SeriesWindow:
    """The last ``ticks`` ticks of every series of one GPU (NaN where a tick had no sample)."""

    __slots__ = ("_data", "_n", "_pending", "_pos", "_times")

    def __init__(self, ticks: int) -> None:
        self._data = np.full((len(SERIES), ticks), np.nan, dtype=np.float32)
        self._times = np.zeros(ticks, dtype=np.int64)
        self._pos = 0
        self._n = 0
        # Rows wait here and enter the ring _CHUNK at a time: one conversion of many rows costs a quarter of
        # what a column assignment per tick does, and attribution reads the window seldom.
        self._pending: list[tuple[int, list[float | None]]] = []

    def push(self, tick_ns: int, values: Mapping[str, float | None], host: Mapping[str, float | None],
             flops_per_watt: float | None = None) -> None:
        row = list(map(values.get, _SAMPLED))
        row.append(flops_per_watt)  # derived, not sampled: given apart
        row += map(host.get, HOST_SERIES)
        self._pending.append((tick_ns, row))
        if len(self._pending) >= _CHUNK:
            self._flush()

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        size = self._data.shape[1]
        pending = pending[-size:]
        block = np.array([row for _, row in pending], dtype=np.float32).T  # None becomes NaN
        cols = (np.arange(len(pending)) + self._pos) % size
        self._data[:, cols] = block
        self._times[cols] = [t for t, _ in pending]
        self._pos = int((self._pos + len(pending)) % size)
        self._n = min(self._n + len(pending), size)

    def ordered(self) -> tuple[np.ndarray, np.ndarray]:
        """(tick times, series x ticks as float64), oldest first."""
        if self._pending:
            self._flush()
        n, size = self._n, self._data.shape[1]
        idx = (np.arange(self._pos - n, self._pos)) % size
        return self._times[idx], self._data[:, idx].astype(np.float64)

    def __len__(self) -> int:
        return min(self._n + len(self._pending), self._data.shape[1])
