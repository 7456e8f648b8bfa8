"""Fills a closed batch's derived columns before it is stored and published.

Two sources: ``streams.efficiency.derive`` (efficiency and cost, from the price book in force)
and the L1 spike engine, which has to see the raw sub-second samples, so the aligner
taps them on their way in (``TappedAligner``), after the same clock correction the
aligner applies. The price book comes from ``prices``, called once per batch: the agents
hand in a function that re-reads the file the user edits.

>>> from schemas.pricebook import parse_price_book
>>> book = parse_price_book('version = 1\\n[default]\\nH100 = 4.0\\n', "prices.toml")
>>> enricher = Enricher(lambda: book, grid_ns=1_000_000_000)
>>> aligner = TappedAligner(AlignParams(allowed_lateness_ns=0), Recovered(), enricher)
>>> util = BY_NAME["gpu_util"].index
>>> aligner.add("n", "0", util, [0, 100_000_000], [50.0, 99.0], {"gpu_model": "H100"})
>>> aligner.add("n", "0", util, [1_100_000_000], [40.0])  # moves the watermark past the first tick
>>> batch = enricher.enrich(aligner.advance(now_ns=0).frames)
>>> batch.column("gpu_util_p99").tolist(), batch.notes
([99.0], ['no_activity,no_power'])
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Final

import numpy as np

from schemas.catalog import BY_NAME
from schemas.frames import SPIKE_SENSORS, peak_column
from schemas.gpus import peak_tflops
from schemas.pricebook import PriceBook
from schemas.records import Labels, Times, Values
from streams.align.aggregate import F64, I64, FrameBatch
from streams.align.aligner import GridAligner, Recovered
from streams.align.correction import Correction, to_utc
from streams.align.grid import AlignParams
from streams.detect.spike_rule import SpikeParams
from streams.detect.spikes import SpikeEngine
from streams.efficiency.derive import IdleParams, derive
from streams.efficiency.subticks import POWER, SM, TENSOR, SubTicks

EVICT_SLACK_NS: Final = 600_000_000_000
SPIKE_SENSOR_INDEX: Final = {BY_NAME[name].index: name for name in SPIKE_SENSORS}
SUB_SENSOR_INDEX: Final = {BY_NAME["tensor_active"].index: TENSOR, BY_NAME["sm_active"].index: SM,
                           BY_NAME["power"].index: POWER}
TAPPED: Final = frozenset(SPIKE_SENSOR_INDEX) | frozenset(SUB_SENSOR_INDEX)


class BookPricing:
    """``streams.efficiency.derive.Pricing`` over a price book (its custom GPUs first, then the shipped specs)."""

    def __init__(self, book: PriceBook) -> None:
        self.book = book

    def knows(self, gpu_model: str) -> bool:
        return self.book.spec(gpu_model) is not None

    def peak_tflops(self, gpu_model: str, precision: str) -> float | None:
        spec = self.book.spec(gpu_model)
        return None if spec is None else peak_tflops(spec, precision)

    def hourly_usd(self, gpu_model: str, region: str | None) -> float | None:
        usd: float | None = self.book.hourly_usd(gpu_model, region)
        return usd


class Enricher:
    """Derived columns for the frames of one worker; ``tap`` sees the spike sensors' samples."""

    def __init__(self, prices: Callable[[], PriceBook], grid_ns: int, idle: IdleParams | None = None,
                 spikes: SpikeParams | None = None) -> None:
        spikes = spikes or SpikeParams()
        self.prices = prices
        self.grid_ns = grid_ns
        self.idle = idle or IdleParams()
        self.spikes = SpikeEngine(spikes, grid_ns)
        # Profiles only where a tick holds several whole buckets (at a 100 ms grid the ticks are the buckets).
        self.subticks = (SubTicks(spikes.bucket_ns, grid_ns)
                         if grid_ns > spikes.bucket_ns and grid_ns % spikes.bucket_ns == 0 else None)
        self._pricing: BookPricing | None = None

    def tap(self, node: str, gpu: str, sensor_index: int, ts_ns: Times, values: Values,
            correction: Correction | None) -> None:
        name = SPIKE_SENSOR_INDEX.get(sensor_index)
        kind = SUB_SENSOR_INDEX.get(sensor_index)
        if (name is None and (kind is None or self.subticks is None)) or not len(ts_ns):
            return
        ts = np.asarray(ts_ns, np.int64)
        if correction is not None:
            ts, _ = to_utc(ts, np.array([len(ts)], np.int64), [(0, correction)])
        vs = np.asarray(values, np.float64)
        if name is not None:
            self.spikes.add(node, gpu, name, ts, vs)
        if kind is not None and self.subticks is not None:
            self.subticks.add(node, gpu, kind, ts, vs)

    def tap_block(self, nodes: Sequence[str], gpus: Sequence[str], sensor_index: int, lens: Sequence[int],
                  ts_ns: I64, values: F64) -> None:
        """``tap`` for several GPUs' samples in UTC at once, back to back (``GridAligner.add_block``'s columns)."""
        name = SPIKE_SENSOR_INDEX.get(sensor_index)
        kind = SUB_SENSOR_INDEX.get(sensor_index)
        if name is not None:
            self.spikes.add_block(nodes, gpus, name, lens, ts_ns, values)
        if kind is not None and self.subticks is not None:
            self.subticks.add_block(nodes, gpus, kind, lens, ts_ns, values)

    def enrich(self, batch: FrameBatch) -> FrameBatch:
        if not len(batch):
            return batch
        book = self.prices()
        if self._pricing is None or self._pricing.book is not book:
            self._pricing = BookPricing(book)
        ticks = batch.tick_ns.tolist()
        peaks = {peak_column(name): self.spikes.close_ticks(batch.node, batch.gpu, name, ticks)
                 for name in SPIKE_SENSORS}
        d = derive(batch, self._pricing, self.grid_ns, self.idle, peaks)
        batch.derived, batch.notes = d.columns, d.notes
        if self.subticks is not None:
            batch.sub_fpw = self._profiles(batch)
        # Ticks release their series as they close; this drops series of nodes that went away.
        # The slack spares nodes whose ticks close later than this batch's (held, lagging).
        self.spikes.evict_before(int(batch.tick_ns.min()) - EVICT_SLACK_NS)
        if self.subticks is not None:
            self.subticks.evict_before(int(batch.tick_ns.min()) - EVICT_SLACK_NS)
        return batch

    def _profiles(self, batch: FrameBatch) -> list[tuple[float | None, ...]]:
        st = self.subticks
        assert st is not None
        tensor, sm = batch.values["tensor_active"], batch.values["sm_active"]
        activity = np.where(tensor == tensor, tensor, sm)
        return st.close(batch.node, batch.gpu, batch.tick_ns, batch.derived["flops_per_watt"], activity,
                        batch.values["power"])


class TappedAligner(GridAligner):
    """A grid aligner that also shows the spike sensors' samples to the enricher."""

    def __init__(self, params: AlignParams, recovered: Recovered, enricher: Enricher) -> None:
        super().__init__(params, recovered)
        self._enricher = enricher

    def add(self, node: str, gpu: str, sensor_index: int, ts_ns: Times, values: Values,
            labels: Labels | None = None, source: Hashable = None, position: int = 0,
            correction: Correction | None = None) -> None:
        super().add(node, gpu, sensor_index, ts_ns, values, labels, source, position, correction)
        if sensor_index in TAPPED:
            self._enricher.tap(node, gpu, sensor_index, ts_ns, values, correction)

    def add_block(self, sensor_index: int, nodes: Sequence[str], gpus: Sequence[str],
                  labels: Sequence[Labels | None], lens: Sequence[int], ts_ns: I64, values: F64,
                  source: Hashable, positions: Sequence[int]) -> None:
        # The tap first: should either raise, the caller places the block's records one by one, and samples the
        # aligner had already queued would count twice (a tap seeing some twice only repeats equal samples).
        if sensor_index in TAPPED:
            self._enricher.tap_block(nodes, gpus, sensor_index, lens, ts_ns, values)
        super().add_block(sensor_index, nodes, gpus, labels, lens, ts_ns, values, source, positions)
