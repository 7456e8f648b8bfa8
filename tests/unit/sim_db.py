"""The simulated clusters the SQL tests query (``tests/unit/conftest.py`` builds the database once)."""

from __future__ import annotations

import time

from streams.sim.simulate import SimParams

DB = "fwviews"
S = 1_000_000_000
HOUR = (time.time_ns() // (3600 * S) - 3) * 3600 * S  # recent: the cookbook's "last 30 days" must see it
H200 = SimParams(nodes=2, gpus=2, seed=7, start_ns=HOUR - 1_200 * S)  # 40 min over an hour's edge
A100 = SimParams(nodes=2, gpus=2, seed=8, start_ns=HOUR + 3_600 * S, gpu_model="A100", region="eu-west")
