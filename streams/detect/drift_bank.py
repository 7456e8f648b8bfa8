"""Efficiency drift for many GPUs: one ``EfficiencyDrift`` per (node, gpu), bounded."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from streams.detect.drift import DriftEvent, EfficiencyDrift
from streams.detect.drift_params import DriftParams


class DriftBank:
    """``EfficiencyDrift`` per (node, gpu); beyond ``max_entities`` the least recently updated goes.

    An evicted GPU's open alert gets no ``resolved`` event from here; the caller, which
    bounds its own state the same way, drops it with the GPU.

    >>> bank = DriftBank(DriftParams(), grid_ns=1_000_000_000, max_entities=2)
    >>> for gpu in "abc":
    ...     _ = bank.update(("n", gpu), 0, 1.0, "job")
    >>> sorted(bank.keys())
    [('n', 'b'), ('n', 'c')]
    """

    def __init__(self, params: DriftParams, grid_ns: int, max_entities: int = 100_000) -> None:
        if max_entities < 1:
            raise ValueError("max_entities must be >= 1")
        params.sizes(grid_ns)  # fail now on a grid the parameters cannot use
        self.params, self.grid_ns, self.max_entities = params, grid_ns, max_entities
        self._gpus: OrderedDict[tuple[str, str], EfficiencyDrift] = OrderedDict()
        self.evicted = 0

    def update(self, key: tuple[str, str], tick_ns: int, value: float | None, context: str,
               suspect: bool = False, load: float | None = None,
               sub: Sequence[float | None] = ()) -> list[DriftEvent]:
        d = self._gpus.get(key)
        if d is None:
            d = self._gpus[key] = EfficiencyDrift(self.params, self.grid_ns)
            if len(self._gpus) > self.max_entities:
                self._gpus.popitem(last=False)
                self.evicted += 1
        else:
            self._gpus.move_to_end(key)
        return d.update(tick_ns, value, context, suspect, load, sub)

    def get(self, key: tuple[str, str]) -> EfficiencyDrift | None:
        return self._gpus.get(key)

    def keys(self) -> list[tuple[str, str]]:
        return list(self._gpus)

    def __len__(self) -> int:
        return len(self._gpus)

    def snapshot(self) -> dict[str, Any]:
        # A list in least-recently-updated order, so eviction continues the same after restore.
        return {"entities": [[node, gpu, d.snapshot()] for (node, gpu), d in self._gpus.items()],
                "evicted": self.evicted}

    @classmethod
    def restore(cls, params: DriftParams, grid_ns: int, snap: Mapping[str, Any],
                max_entities: int = 100_000) -> DriftBank:
        bank = cls(params, grid_ns, max_entities)
        for node, gpu, s in snap["entities"][-max_entities:]:
            bank._gpus[(str(node), str(gpu))] = EfficiencyDrift.restore(params, grid_ns, s)
        bank.evicted = int(snap["evicted"])
        return bank
