"""Sample messages decoded a poll at a time, in columns: the ingest's hot path (``agents.ingest.core``).

The lone-message decoder (``schemas.codec.decode_samples``) is the oracle: this one gives the same batch or the
same reject for every message, and leaves every message it does not accept at once to that decoder's checked path.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import msgspec
import numpy as np

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
    spec = BY_NAME.get(sensor)
    out: list[SampleBatch | Reject | None] = [None] * len(raws)
    if spec is not None:
        _fast_columns(raws, sensor, spec.lo, spec.hi, limits, out)
    return [got if got is not None else decode_samples(raw, sensor, limits, fast=False)
            for got, raw in zip(out, raws, strict=True)]


def _fast_columns(raws: Sequence[bytes], sensor: str, v_lo: float, v_hi: float, limits: TimeLimits | None,
                  out: list[SampleBatch | Reject | None]) -> None:
    """Fill ``out`` with the batches every check accepts; the rest stay None."""
    ts_all, vs_all = array("q"), array("d")
    taken: list[tuple[int, str, str, str, Labels | None]] = []  # (message index, node, gpu, clock, labels)
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
        if type(values) is list:
            if type(stamps) is not list or len(stamps) != len(values) or not values:
                continue
        elif type(stamps) is list:
            continue
        else:
            values, stamps = [values], [stamps]  # type: ignore[list-item]
        try:
            labels = _labels_of_raw(bytes(w.labels))
        except _Refused:
            continue
        n = len(ts_all)
        try:
            ts_all.extend(stamps)
        except OverflowError:  # beyond int64: the checked path says so
            del ts_all[n:]
            continue
        vs_all.extend(values)
        taken.append((i, w.node, w.gpu, w.clock, labels))
        lens.append(len(values))
    if not taken:
        return
    ts, vs = np.frombuffer(ts_all, np.int64), np.frombuffer(vs_all, np.float64)
    ends = np.cumsum(np.array(lens, np.int64))
    starts = ends - lens
    lo, hi = np.minimum.reduceat(ts, starts), np.maximum.reduceat(ts, starts)
    # No NaN comes through JSON, so each message's least and greatest value bound all of them.
    ok = (np.minimum.reduceat(vs, starts) >= v_lo) & (np.maximum.reduceat(vs, starts) <= v_hi)
    if limits is not None:  # the time limits hold for UTC stamps only (a domain's are placed later)
        utc = np.array([clock == UTC_CLOCK for _, _, _, clock, _ in taken])
        ok &= ~utc | ((lo >= limits.now_ns - limits.max_age_ns) & (hi <= limits.now_ns + limits.max_future_ns))
    for (i, node, gpu, clock, labels), a, b, t_lo, t_hi, good in zip(
            taken, starts.tolist(), ends.tolist(), lo.tolist(), hi.tolist(), ok.tolist(), strict=True):
        if good:
            out[i] = SampleBatch(sensor, node, gpu, ts[a:b], vs[a:b], clock, labels, t_lo, t_hi)
