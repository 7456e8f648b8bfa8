"""Sample messages decoded a poll at a time, in columns: the ingest's hot path (``agents.ingest.core``).

A poll is parsed by the native decoder (``native/``, Rust: one call for all its messages, no Python object per
number) when every message is on its happy path, else message by message by msgspec; both give the same columns.
The lone-message decoder (``schemas.codec.decode_samples``) is the oracle: this one gives the same batch or the
same reject for every message, and leaves every message it does not accept at once to that decoder's checked path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt
from flopwatch_native import sample_columns

from schemas.catalog import BY_NAME
from schemas.codec import _WIRE, TimeLimits, _labels_of_raw, _Refused, decode_samples
from schemas.records import UTC_CLOCK, WIRE_VERSION, Labels, Reject, SampleBatch


def decode_sample_messages(raws: Sequence[bytes], sensor: str, limits: TimeLimits | None = None
                           ) -> list[SampleBatch | Reject]:
    """Decode the ``sensors.<sensor>`` messages of one poll together: what ``decode_samples`` gives for each.

    Each message is parsed by msgspec (types checked in C) and its samples appended to the poll's two
    columns; the range and time checks then run over all samples at once with numpy, and every accepted
    batch's ``ts_ns`` and ``value`` are int64 and float64 views of its rows. A message any check refuses
    takes the checked path of ``decode_samples``, which names the reason, so the results do not depend on
    which path a message took.

    >>> ok = b'{"v": 1, "node": "n", "gpu": "0", "ts_ns": [5, 9], "value": [300, 310.5]}'
    >>> got = decode_sample_messages([ok, b'{"v": 1}', ok.replace(b"310.5", b"1e9")], "power")
    >>> got[0].ts_ns.tolist(), got[0].value.tolist(), got[0].span, got[1].reason.value, got[2].reason.value
    ([5, 9], [300.0, 310.5], (5, 9), 'missing_field', 'out_of_range')
    """
    out: list[SampleBatch | Reject | None] = [None] * len(raws)
    cols = _fast_columns(raws, sensor, limits)
    if cols is not None:
        for m in np.flatnonzero(cols.ok).tolist():
            out[cols.index[m]] = cols.batch(m, sensor)
    return _checked_rest(raws, sensor, limits, out, set())  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class PollBlock:
    """The messages of a poll in UTC that every check accepted, as ``GridAligner.add_block`` takes them: message
    ``index[k]`` of the poll has ``lens[k]`` samples, back to back with the others' in ``ts_ns`` and ``value``."""

    index: list[int]
    nodes: list[str]
    gpus: list[str]
    labels: list[Labels | None]
    lens: list[int]
    ts_ns: npt.NDArray[np.int64]
    value: npt.NDArray[np.float64]


_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
EMPTY_BLOCK: Final = PollBlock([], [], [], [], [], np.zeros(0, np.int64), np.zeros(0, np.float64))


def decode_poll(raws: Sequence[bytes], sensor: str, limits: TimeLimits | None = None
                ) -> tuple[PollBlock, list[SampleBatch | Reject | None]]:
    """``decode_sample_messages`` for the ingest: the accepted messages in UTC as one block, no object per message;
    per message the rest (None where the block holds it): a clock domain's as a ``SampleBatch``, whatever the
    fast path does not accept as ``decode_samples`` names it.

    >>> ok = b'{"v": 1, "node": "n", "gpu": "0", "ts_ns": [5, 9], "value": [300, 310.5]}'
    >>> one = b'{"v": 1, "node": "n", "gpu": "1", "ts_ns": 7, "value": 1}'
    >>> block, rest = decode_poll([ok, b'{"v": 1}', one], "power")
    >>> block.index, block.lens, block.ts_ns.tolist(), block.value.tolist(), rest[0], rest[1].reason.value
    ([0, 2], [2, 1], [5, 9, 7], [300.0, 310.5, 1.0], None, 'missing_field')
    """
    rest: list[SampleBatch | Reject | None] = [None] * len(raws)
    c = _fast_columns(raws, sensor, limits)
    block = EMPTY_BLOCK
    if c is not None:
        take = c.utc & c.ok
        if not take.all():  # a clock domain's accepted messages go as batches (the usual poll has none)
            for m in np.flatnonzero(c.ok & ~c.utc).tolist():
                rest[c.index[m]] = c.batch(m, sensor)
        if take.any():
            block = c.block(take)
    if len(block.index) == len(raws):  # the usual poll: every message in the block, nothing left to check
        return block, rest
    return block, _checked_rest(raws, sensor, limits, rest, set(block.index))


def _checked_rest(raws: Sequence[bytes], sensor: str, limits: TimeLimits | None,
                  got: list[SampleBatch | Reject | None], held: set[int]) -> list[SampleBatch | Reject | None]:
    """``got`` with each message neither decoded yet nor ``held`` by a block taken by the checked path, which
    names its reason."""
    for i, raw in enumerate(raws):
        if got[i] is None and i not in held:
            got[i] = decode_samples(raw, sensor, limits, fast=False)
    return got


@dataclass(frozen=True, slots=True)
class _Columns:
    """The messages the fast path parsed, in parallel lists (their place in the poll, node, gpu, clock, labels and
    sample count), their rows in ``ts`` and ``vs`` (``starts`` to ``ends``), least and greatest stamps, and
    whether every check accepts each. The per-message figures stay arrays: the usual poll reads none of them one
    by one."""

    index: list[int]
    nodes: list[str]
    gpus: list[str]
    clocks: list[str]
    utc: npt.NDArray[np.bool_]  # per message, whether its clock is UTC
    labels: list[Labels | None]
    lens: list[int]
    ts: npt.NDArray[np.int64]
    vs: npt.NDArray[np.float64]
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    lo: npt.NDArray[np.int64]
    hi: npt.NDArray[np.int64]
    ok: npt.NDArray[np.bool_]

    def batch(self, m: int, sensor: str) -> SampleBatch:
        """The m-th parsed message as a batch whose columns are views of the poll's."""
        a, b = int(self.starts[m]), int(self.ends[m])
        return SampleBatch(sensor, self.nodes[m], self.gpus[m], self.ts[a:b], self.vs[a:b], self.clocks[m],
                           self.labels[m], int(self.lo[m]), int(self.hi[m]))

    def block(self, take: npt.NDArray[np.bool_]) -> PollBlock:
        """The messages ``take`` marks, as the ingest's block; all of them as parsed when it marks all."""
        if take.all():  # the usual poll
            return PollBlock(self.index, self.nodes, self.gpus, self.labels, self.lens, self.ts, self.vs)
        keep = np.repeat(take, self.lens)
        marks = take.tolist()
        return PollBlock(list(compress(self.index, marks)), list(compress(self.nodes, marks)),
                         list(compress(self.gpus, marks)), list(compress(self.labels, marks)),
                         list(compress(self.lens, marks)), self.ts[keep], self.vs[keep])


def _fast_columns(raws: Sequence[bytes], sensor: str, limits: TimeLimits | None) -> _Columns | None:
    """The poll's messages that parse into the wire's shape (all of them natively, else those msgspec parses),
    checked together; None if none does."""
    spec = BY_NAME.get(sensor)
    if spec is None or not raws:
        return None
    parsed = _native_parse(raws, sensor)
    if parsed is None:
        parsed = _python_parse(raws, sensor)
    if parsed is None:
        return None
    index, nodes, gpus, clocks, labels, lens, ts, vs, wide = parsed
    return _checked_columns(spec.lo, spec.hi, limits, index, nodes, gpus, clocks, labels, lens, ts, vs, wide)


_Parsed = tuple[list[int], list[str], list[str], list[str], list[Labels | None], list[int],
                npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.bool_] | None]


def _native_parse(raws: Sequence[bytes], sensor: str) -> _Parsed | None:
    """Every message of the poll parsed by the native decoder (``native/``), or None when any is off its happy path
    (the Python parse then takes the poll, message by message, as msgspec sees each)."""
    got = sample_columns(raws if type(raws) is list else list(raws), WIRE_VERSION, sensor)
    if got is None:
        return None
    nodes, gpus, clocks, raw_labels, lens, ts, vs = got
    try:
        labels = [None if r is None else _labels_of_raw(r) for r in raw_labels]
    except _Refused:
        return None
    return (list(range(len(lens))), nodes, gpus, clocks, labels, lens, np.frombuffer(ts, np.int64),
            np.frombuffer(vs, np.float64), None)


def _python_parse(raws: Sequence[bytes], sensor: str) -> _Parsed | None:
    """The messages msgspec parses into the wire's shape, one by one; None if none is."""
    # Python lists first and one conversion per column at the end: a list takes a message's list of stamps as
    # pointers, where an array converts every number as it comes (2x the cost of the whole conversion).
    ts_all: list[int] = []
    vs_all: list[float] = []
    index: list[int] = []
    nodes: list[str] = []
    gpus: list[str] = []
    clocks: list[str] = []
    labels: list[Labels | None] = []
    lens: list[int] = []
    decode = _WIRE.decode
    for i, raw in enumerate(raws):
        try:
            w = decode(raw)
        except msgspec.DecodeError:
            continue
        if w.v != WIRE_VERSION or not w.node or not w.gpu or not w.clock \
                or (w.sensor is not None and w.sensor != sensor):
            continue
        values, stamps = w.value, w.ts_ns
        try:
            labs = _labels_of_raw(bytes(w.labels))
        except _Refused:
            continue
        if type(values) is list:
            if type(stamps) is not list or len(stamps) != len(values) or not values:
                continue
            ts_all.extend(stamps)
            vs_all.extend(values)
            lens.append(len(values))
        elif type(stamps) is list:
            continue
        else:
            ts_all.append(stamps)  # type: ignore[arg-type]
            vs_all.append(values)  # type: ignore[arg-type]
            lens.append(1)
        index.append(i)
        nodes.append(w.node)
        gpus.append(w.gpu)
        clocks.append(w.clock)
        labels.append(labs)
    if not index:
        return None
    wide = None
    try:
        ts = np.fromiter(ts_all, np.int64, len(ts_all))
    except OverflowError:  # a stamp beyond int64 (rare): its message fails the checks, and the checked path names it
        wide = np.fromiter((not _I64_MIN <= t <= _I64_MAX for t in ts_all), np.bool_, len(ts_all))
        ts = np.fromiter((0 if w else t for t, w in zip(ts_all, wide.tolist(), strict=True)), np.int64, len(ts_all))
    vs = np.fromiter(vs_all, np.float64, len(vs_all))
    return index, nodes, gpus, clocks, labels, lens, ts, vs, wide


def _checked_columns(v_lo: float, v_hi: float, limits: TimeLimits | None, index: list[int], nodes: list[str],
                     gpus: list[str], clocks: list[str], labels: list[Labels | None], lens: list[int],
                     ts: npt.NDArray[np.int64], vs: npt.NDArray[np.float64], wide: npt.NDArray[np.bool_] | None
                     ) -> _Columns:
    """The parsed messages with the range and time checks run over all their samples at once; ``wide`` marks the
    stamps beyond int64 (their messages fail)."""
    ends = np.cumsum(np.array(lens, np.int64))
    starts = ends - lens
    lo, hi = np.minimum.reduceat(ts, starts), np.maximum.reduceat(ts, starts)
    # No NaN comes through JSON, so each message's least and greatest value bound all of them.
    ok = (np.minimum.reduceat(vs, starts) >= v_lo) & (np.maximum.reduceat(vs, starts) <= v_hi)
    if wide is not None:
        ok &= ~np.logical_or.reduceat(wide, starts)
    n = len(clocks)
    if clocks.count(UTC_CLOCK) == n:  # the usual poll (count runs in C)
        utc = np.ones(n, np.bool_)
    else:
        utc = np.fromiter((clock == UTC_CLOCK for clock in clocks), np.bool_, n)
    if limits is not None:  # the time limits hold for UTC stamps only (a domain's are placed later)
        fresh = (lo >= limits.now_ns - limits.max_age_ns) & (hi <= limits.now_ns + limits.max_future_ns)
        ok &= ~utc | fresh
    return _Columns(index, nodes, gpus, clocks, utc, labels, lens, ts, vs, starts, ends, lo, hi, ok)
