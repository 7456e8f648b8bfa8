"""Each frame's FLOPS/W in 100 ms buckets: what lets the drift rule time a hold to the sub-second.

A frame's FLOPS/W is its tick's mean activity over its mean power. The drift rule confirms "12%
below for 3 s" (seed 000 §1), and on a 1 s grid a tick-level rule can only say so at the end of the
tick in which the 3 s complete: 3-4 s after the onset. The raw samples (10 Hz) say more: this
module keeps, per GPU, the sums of the tick's activity (tensor, else SM) and power samples in
buckets of ``bucket_ns``, and gives each closed frame its profile: the FLOPS/W of each bucket,
scaled from the frame's own FLOPS/W (so the profile's mean matches the frame, whatever the price
book says the GPU's peak is), None where a bucket has no activity or power sample.

Columnar, because it sees every activity and power sample: ``add`` only queues a message's arrays;
the queue is folded into the held sums with one grouped numpy reduction when frames close, and a
batch of closed frames gets its profiles and releases its buckets in one pass (``close``). The held
sums are one sorted key column (GPU id and bucket packed into an int64) and a (buckets, 6) array
of [tensor sum, n, sm sum, n, power sum, n].

Bounded: a GPU's buckets are released as its ticks close, buckets behind ``evict_before`` are
dropped with GPUs that went away, at most ``max_series`` GPUs are held, and the queue is folded
once it holds ``fold_samples`` samples.

>>> import numpy as np
>>> st = SubTicks(bucket_ns=100, grid_ns=1_000)
>>> ts = np.arange(0, 1_000, 100, dtype=np.int64)
>>> st.add("n", "0", TENSOR, ts, np.array([0.8] * 5 + [0.6] * 5))
>>> st.add("n", "0", POWER, ts, np.full(10, 400.0))
>>> [round(x, 3) for x in st.profile("n", "0", 0, fpw=1.4, activity=0.7, power=400.0)]
[1.6, 1.6, 1.6, 1.6, 1.6, 1.2, 1.2, 1.2, 1.2, 1.2]
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

TENSOR: Final = 0
SM: Final = 1
POWER: Final = 2
_SHIFT: Final = 40  # key = GPU id << 40 | bucket: buckets of 100 ms reach 2**40 in ~3,500 years of ns time
_MASK: Final = (1 << _SHIFT) - 1
_FOLD_SAMPLES: Final = 1 << 20

Profile = tuple[float | None, ...]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


class SubTicks:
    """Activity and power sums per bucket, per (node, gpu)."""

    def __init__(self, bucket_ns: int, grid_ns: int, max_series: int = 200_000,
                 fold_samples: int = _FOLD_SAMPLES) -> None:
        if bucket_ns <= 0 or grid_ns % bucket_ns:
            raise ValueError("grid_ns must be a multiple of bucket_ns > 0")
        if max_series >= 1 << (63 - _SHIFT):
            raise ValueError(f"max_series must be below {1 << (63 - _SHIFT)}")
        self.bucket_ns, self.grid_ns, self.max_series = bucket_ns, grid_ns, max_series
        self.fold_samples = fold_samples
        self._ids: OrderedDict[tuple[str, str], int] = OrderedDict()  # least recently fed first
        self._free: list[int] = []  # ids whose buckets are gone, to reuse
        self._dead: list[int] = []  # ids of evicted GPUs whose buckets the next fold drops
        self._released = np.zeros(0, np.int64)  # per id: no bucket below this is held once folded
        # The queue: per message, its id, kind, stamps and values
        self._queue: list[tuple[I64, int, I64, F64]] = []  # (id per sample, kind, ...)
        self._queued = 0
        self._keys = np.zeros(0, np.int64)
        self._sums = np.zeros((0, 6), np.float64)
        self._floor = 0  # buckets below this are closed (evict_before); negative stamps are never held

    def add(self, node: str, gpu: str, kind: int, ts_ns: I64, values: F64) -> None:
        """Queue one GPU's ``kind`` samples (any order; NaN values are skipped)."""
        self.add_block([node], [gpu], kind, [len(ts_ns)], ts_ns, values)

    def add_block(self, nodes: Sequence[str], gpus: Sequence[str], kind: int, lens: Sequence[int], ts_ns: I64,
                  values: F64) -> None:
        """``add`` for several GPUs' ``kind`` samples at once: GPU i's ``lens[i]`` lie back to back with the others'."""
        ids = self._ids
        if len(nodes) > 1 and len(ids) + len(nodes) > self.max_series:
            # A new GPU may evict one whose id this block already took: one at a time, each queued before the next.
            a = 0
            for node, gpu, n in zip(nodes, gpus, lens, strict=True):
                self.add_block([node], [gpu], kind, [n], ts_ns[a:a + n], values[a:a + n])
                a += n
            return
        sids = []
        for key in zip(nodes, gpus, strict=True):
            sid = ids.get(key)
            if sid is None:
                sid = self._new_id(key)
            else:
                ids.move_to_end(key)
            sids.append(sid)
        self._queue.append((np.repeat(np.array(sids, np.int64), lens), kind, ts_ns, values))
        self._queued += len(ts_ns)
        if self._queued >= self.fold_samples:
            self._fold()

    def _new_id(self, key: tuple[str, str]) -> int:
        if len(self._ids) >= self.max_series:
            _, gone = self._ids.popitem(last=False)
            self._dead.append(gone)
        if not self._free:
            self._fold()  # drops the dead ids' buckets, so their ids can be reused
        if self._free:
            sid = self._free.pop()
        else:
            sid = len(self._released)
            self._released = np.append(self._released, np.zeros(max(sid, 64), np.int64))
            self._free.extend(range(len(self._released) - 1, sid, -1))
        self._released[sid] = 0
        self._ids[key] = sid
        return sid

    def _fold(self) -> None:
        """Fold the queue into the held sums; drop what is released, evicted or behind the floor."""
        if self._queue:
            sids = np.concatenate([sid for sid, _, _, _ in self._queue])
            cols = np.concatenate([np.full(len(t), 2 * kind, np.int64) for _, kind, t, _ in self._queue])
            ts = np.concatenate([t for _, _, t, _ in self._queue])
            vs = np.concatenate([v for _, _, _, v in self._queue])
            self._queue, self._queued = [], 0
            buckets = ts // self.bucket_ns
            ok = (vs == vs) & (buckets >= self._floor) & (buckets <= _MASK)
            keys = (sids[ok] << _SHIFT) | buckets[ok]
            cols, vs = cols[ok], vs[ok]
            uniq, inv = _unique_of_runs(np.concatenate([self._keys, keys]))
            sums = np.zeros((len(uniq), 6), np.float64)
            held = len(self._keys)
            sums[inv[:held]] = self._sums  # held keys are unique: a plain scatter
            new = inv[held:]
            # One grouped reduction for the values and one for the counts, both in arrival order.
            flat = new * 6 + cols
            size = 6 * len(uniq)
            sums += (np.bincount(flat, weights=vs, minlength=size)
                     + np.bincount(flat + 1, minlength=size)).reshape(-1, 6)
            self._keys, self._sums = uniq, sums
        keep = (self._keys & _MASK) >= np.maximum(self._released[self._keys >> _SHIFT], self._floor)
        if self._dead:
            keep &= ~np.isin(self._keys >> _SHIFT, np.array(self._dead, np.int64))
            self._free.extend(self._dead)
            self._dead = []
        if not keep.all():
            self._keys, self._sums = self._keys[keep], self._sums[keep]

    def close(self, nodes: Sequence[str], gpus: Sequence[str], ticks: I64, fpw: F64, activity: F64, power: F64
              ) -> list[Profile]:
        """Profiles of closed frames (the tick's FLOPS/W per bucket, from each frame's ``fpw`` and the means it
        was made of), then their ticks' buckets released: a node's ticks close in order."""
        n_frames, per = len(ticks), self.grid_ns // self.bucket_ns
        if not n_frames:
            return []
        self._fold()
        ids = self._ids
        sid = np.array([ids.get(k, -1) for k in zip(nodes, gpus, strict=True)], np.int64)
        first = np.asarray(ticks, np.int64) // self.bucket_ns
        want = ((np.maximum(sid, 0) << _SHIFT) | first)[:, None] + np.arange(per, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._keys, want), max(len(self._keys) - 1, 0))
        if len(self._keys):
            found = (self._keys[pos] == want) & (sid >= 0)[:, None]
            acc = np.where(found[:, :, None], self._sums[pos], 0.0)  # (frames, buckets, 6)
        else:
            acc = np.zeros((n_frames, per, 6))
        tensor: npt.NDArray[np.bool_] = np.asarray((acc[:, :, 1] > 0).any(axis=1))
        act_sum = np.where(tensor[:, None], acc[:, :, 0], acc[:, :, 2])
        act_n = np.where(tensor[:, None], acc[:, :, 1], acc[:, :, 3])
        fpw, activity, power = (np.asarray(x, np.float64)[:, None] for x in (fpw, activity, power))
        ok = (act_n > 0) & (acc[:, :, 5] > 0) & (acc[:, :, 4] > 0) & (fpw == fpw) & (activity > 0) & (power > 0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # The same operations, in the same order, as one frame's profile always took.
            prof = fpw * ((act_sum / act_n) / activity) * (power / (acc[:, :, 4] / acc[:, :, 5]))
        # A power reading of a few 1e-313 W (in range, but no real sensor's) overflows to inf or 0 x inf: a
        # figure that cannot be told, like an empty bucket; the frames contract carries finite numbers only.
        prof = np.where(ok & np.isfinite(prof), prof, np.nan)
        # Release: per GPU, up to the end of its newest closed tick.
        known = sid >= 0
        if known.any():
            np.maximum.at(self._released, sid[known], first[known] + per)
        out: list[Profile] = []
        none = (None,) * per
        for row, any_ok in zip(prof.tolist(), ok.any(axis=1).tolist(), strict=True):
            out.append(tuple(None if x != x else x for x in row) if any_ok else none)
        return out

    def profile(self, node: str, gpu: str, tick_ns: int, fpw: float, activity: float, power: float) -> Profile:
        """One frame's profile, without releasing its buckets."""
        sid = self._ids.get((node, gpu))
        before = 0 if sid is None else int(self._released[sid])
        got = self.close([node], [gpu], np.array([tick_ns], np.int64), np.array([fpw]), np.array([activity]),
                         np.array([power]))[0]
        if sid is not None:
            self._released[sid] = before
        return got

    def release(self, node: str, gpu: str, tick_ns: int) -> None:
        """The GPU's ticks up to ``tick_ns`` are closed: drop their buckets (at the next fold)."""
        sid = self._ids.get((node, gpu))
        if sid is not None:
            end = (tick_ns + self.grid_ns) // self.bucket_ns
            self._released[sid] = max(int(self._released[sid]), end)

    def evict_before(self, ts_ns: int) -> None:
        """Drop buckets before ``ts_ns``, and GPUs left with none."""
        floor = ts_ns // self.bucket_ns
        if floor <= self._floor:
            return
        self._floor = floor
        self._fold()
        ids = self._keys >> _SHIFT  # ascending, as the keys are
        alive = set(ids[np.flatnonzero(ids[1:] != ids[:-1]) + 1].tolist()) | set(ids[:1].tolist())
        for key, sid in list(self._ids.items()):
            if sid not in alive:
                del self._ids[key]
                self._free.append(sid)

    def buckets_held(self) -> int:
        self._fold()
        return len(self._keys)

    def buckets_of(self, node: str, gpu: str) -> list[int]:
        """The buckets held for one GPU, in order (for tests and inspection)."""
        self._fold()
        sid = self._ids.get((node, gpu))
        if sid is None:
            return []
        held: list[int] = (self._keys[(self._keys >> _SHIFT) == sid] & _MASK).tolist()
        return held


def _unique_of_runs(keys: I64) -> tuple[I64, I64]:
    """``np.unique(keys, return_inverse=True)`` for keys that come in ascending runs (the held keys, then each
    message's, in time order): a stable sort merges runs (timsort) where ``np.unique`` sorts from scratch, half
    the time on a poll's keys.

    >>> u, inv = _unique_of_runs(np.array([2, 5, 9, 1, 2, 3, 9, 9], np.int64))
    >>> u.tolist(), inv.tolist()
    ([1, 2, 3, 5, 9], [1, 3, 4, 0, 1, 2, 4, 4])
    """
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    first = np.empty(len(ordered), np.bool_)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    inv = np.empty(len(keys), np.int64)
    inv[order] = np.cumsum(first) - 1
    return ordered[first], inv
