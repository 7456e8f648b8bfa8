"""What a grid aligner was given since its last advance: the messages' columns, queued as they came.

``add`` queues one message (one series' samples), ``add_block`` the messages of a whole poll of one
sensor that arrived as one pair of columns (``schemas.poll_decode``): one append for all of them, so the
per-message cost is an id lookup. ``take`` hands everything over as flat arrays and starts afresh.

>>> p = Pending()
>>> p.add(0, 0, 7, np.array([5, 9]), np.array([1.0, 2.0]), None)
>>> p.add_block([1, 2], 0, [8, 9], [1, 2], np.array([4, 6, 8]), np.array([3.0, 4.0, 5.0]))
>>> q = p.take()
>>> q.ts.tolist(), q.sid.tolist(), q.pos.tolist(), q.msg_len.tolist(), bool(p)
([5, 9, 4, 6, 8], [0, 0, 1, 2, 2], [7, 7, 8, 9, 9], [2, 1, 2], False)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from streams.align.aggregate import F64, I64
from streams.align.correction import Correction, to_utc


@dataclass(frozen=True, slots=True)
class Queued:
    """The queue's contents: per sample (``ts`` in UTC, with each correction's uncertainty in ``unc``) and
    per message (its series, source, position and length)."""

    ts: I64
    v: F64
    unc: I64
    sid: I64
    src: I64
    pos: I64
    msg_sid: I64
    msg_src: I64
    msg_len: I64
    msg_src_list: list[int]
    msg_pos_list: list[int]


class Pending:
    __slots__ = ("_fix", "_len", "_pos", "_sid", "_src", "_ts", "_v")

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._ts: list[I64] = []
        self._v: list[F64] = []
        self._sid: list[int] = []
        self._len: list[int] = []
        self._src: list[int] = []
        self._pos: list[int] = []
        self._fix: list[tuple[int, Correction]] = []  # (message index, its clock correction)

    def __bool__(self) -> bool:
        return bool(self._len)

    def add(self, sid: int, src: int, position: int, ts: I64, v: F64, correction: Correction | None) -> None:
        self._ts.append(ts)
        self._v.append(v)
        self._sid.append(sid)
        self._len.append(len(ts))
        self._src.append(src)
        self._pos.append(position)
        if correction is not None:
            self._fix.append((len(self._len) - 1, correction))

    def add_block(self, sids: Sequence[int], src: int, positions: Sequence[int], lens: Sequence[int],
                  ts: I64, v: F64) -> None:
        """Messages in UTC whose samples lie back to back in ``ts`` and ``v``, ``lens[i]`` of them each."""
        self._ts.append(ts)
        self._v.append(v)
        self._sid.extend(sids)
        self._len.extend(lens)
        self._src.extend([src] * len(sids))
        self._pos.extend(positions)

    def positions(self) -> Iterator[tuple[int, int]]:
        """(source, position) of each queued message."""
        return zip(self._src, self._pos, strict=True)

    def take(self) -> Queued:
        lens = np.array(self._len, np.int64)
        ts = np.concatenate(self._ts)  # a copy even of one array: the open cells keep it, the caller may not
        v = np.concatenate(self._v)
        msg_sid = np.array(self._sid, np.int64)
        msg_src = np.array(self._src, np.int64)
        msg_pos = np.array(self._pos, np.int64)
        if self._fix:
            ts, unc = to_utc(ts, lens, self._fix)
        else:
            unc = np.zeros(len(ts), np.int64)
        out = Queued(ts, v, unc, np.repeat(msg_sid, lens), np.repeat(msg_src, lens), np.repeat(msg_pos, lens),
                     msg_sid, msg_src, lens, self._src, self._pos)
        self._clear()
        return out
