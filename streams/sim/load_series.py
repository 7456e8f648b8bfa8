"""Per-tick FLOPS/W and power of one GPU whose load moves, with the physics of a real GPU.

For the drift benchmark's look-alikes (``deploy/bench/drift.py``) and the drift tests: the load (activity)
follows a profile, the power follows the load (idle plus a dynamic part ~ activity^0.6,
settling with a 0.5 s time constant, as ``streams.sim.generators`` has it), and FLOPS/W
is the tick's work over its energy. A load change alone moves FLOPS/W a long way (at
20% load a GPU does a third of the work per watt it does at full load) and must never
look like a drift; ``drop`` puts a true drift (less work for the same power) on top: a slower
kernel, or (``capped``) clocks throttled under the power cap, which holds the power where it
was but makes it hunt around the cap (1% per tick instead of NVML's 0.3%).
Computed at 10 ms steps, then averaged per tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.signal import lfilter

S = 1_000_000_000
STEP_NS = 10_000_000
TAU_S = 0.5


@dataclass(frozen=True, slots=True)
class Load:
    """The activity profile: ``base`` until ``onset_s``, then ``profile`` for ``length_s`` (then ``base``)."""

    profile: str  # "steady" | "step" | "square" | "sine" | "diurnal"
    base: float  # activity before the event, 0-1
    level: float = 1.0  # load factor at the profile's low (or high, when > 1) point
    period_s: float = 0.0
    onset_s: float = 0.0
    length_s: float = 0.0

    def factor(self, t_s: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        x = t_s - self.onset_s
        inside = (x >= 0) & (x < self.length_s)
        lo = self.level
        if self.profile == "steady":
            f = np.ones_like(t_s)
        elif self.profile == "step":
            f = np.full_like(t_s, lo)
        elif self.profile == "square":
            f = np.where(np.mod(x, self.period_s) < self.period_s / 2, lo, 1.0)
        elif self.profile == "sine":
            f = 1.0 - (1.0 - lo) * np.sin(np.pi * x / self.period_s) ** 2
        elif self.profile == "diurnal":
            f = 1.0 - (1.0 - lo) * np.sin(np.pi * x / self.length_s) ** 2
        else:
            raise ValueError(f"unknown profile {self.profile!r}")
        return np.where(inside, f, 1.0)


def load_ticks(grid_ns: int, seconds: float, load: Load, noise: float, seed: int, drop: float = 0.0,
               drop_onset_s: float = 0.0, drop_length_s: float = 0.0, idle_w: float = 110.0,
               span_w: float = 590.0, capped: bool = False,
               power_noise: float = 0.003) -> tuple[list[int], list[float], list[float]]:
    """(tick starts, FLOPS/W, mean power W) per tick; ``noise`` is the per-tick relative noise of FLOPS/W,
    ``power_noise`` that of the power reading (NVML's is good to a few watts: 0.3%)."""
    rng = np.random.default_rng(seed)
    n_steps = int(seconds * S) // STEP_NS
    t_s = np.arange(n_steps, dtype=np.float64) * (STEP_NS / S)
    act = np.clip(load.base * load.factor(t_s), 0.0, 1.0)
    target = idle_w + span_w * act**0.6
    a = 1.0 - math.exp(-(STEP_NS / S) / TAU_S)
    power = lfilter([a], [1.0, a - 1.0], target, zi=[target[0] * (1 - a)])[0]
    in_drop = (t_s >= drop_onset_s) & (t_s < drop_onset_s + drop_length_s)
    work = 1e15 * act * np.where(in_drop, 1.0 - drop, 1.0)
    per = grid_ns // STEP_NS
    n = n_steps // per
    w = work[: n * per].reshape(n, per).mean(axis=1)
    p = power[: n * per].reshape(n, per).mean(axis=1)
    tick_s = np.arange(n) * (grid_ns / S)
    hunting = capped & (tick_s >= drop_onset_s) & (tick_s < drop_onset_s + drop_length_s)
    p_obs = p * (1.0 + rng.normal(0.0, 1.0, n) * np.where(hunting, max(0.01, power_noise), power_noise))
    fpw = w / p_obs * (1.0 + rng.normal(0.0, noise, n))  # as the worker: the work over the measured power
    return (np.arange(n, dtype=np.int64) * grid_ns).tolist(), fpw.tolist(), p_obs.tolist()
