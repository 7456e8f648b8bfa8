"""Two leaks and a look-alike through real Kafka, the Faust detection agent and chDB: each leak alerts once, its
attribution names the planted cause, the look-alike stays quiet, and `flopwatch leaks` prices both."""

from __future__ import annotations

import time
from collections import defaultdict

import orjson
import pytest
from click.testing import CliRunner

from agents.cli.main import cli
from agents.collect.simulator import SimulatorPublisher
from agents.kafka.topics import Topics
from agents.settings import Settings, settings_env
from schemas.alerts import Alert, decode_alert
from streams.sim.scenario import parse_scenario
from streams.sim.simulate import SimParams
from tests.integration.helpers import Worker
from tests.integration.test_detection import read_topic

pytestmark = pytest.mark.integration
S = 1_000_000_000
SCENARIO = """
version = 1
[[event]]  # node-00 trains: its dataloader starves GPU 0 (preprocessing pins the CPUs first)
kind = "leak"
rule = "pipeline_stall"
node = "node-00"
gpu = "0"
start_s = 150.0
duration_s = 150.0
[[event]]  # node-01 serves: full checkpoints of an unchanged state every 30 s block its GPUs
kind = "leak"
rule = "checkpoint_io_storm"
node = "node-01"
gpu = "*"
start_s = 60.0
duration_s = 240.0
period_s = 30.0
[[event]]  # a look-alike: GPU 1's dataloader stalls 2 s in every 10 s
kind = "leak"
rule = "pipeline_stall"
variant = "short"
node = "node-00"
gpu = "1"
start_s = 100.0
duration_s = 200.0
"""


def test_two_leaks_alert_once_with_their_causes_and_the_ledger_prices_them(base_settings: Settings) -> None:
    duration = 330.0
    params = SimParams(nodes=2, gpus=2, seed=4, start_ns=(time.time_ns() - int(duration * S)) // S * S)
    SimulatorPublisher(base_settings, params, batch_size=50, scenario=parse_scenario(SCENARIO, "t")).backlog(duration)
    topic = Topics(base_settings.topic_prefix).alerts
    worker = Worker(base_settings, "--runtime", "faust")
    try:
        deadline = time.monotonic() + 240
        leaks: dict[str, list[Alert]] = defaultdict(list)
        while time.monotonic() < deadline:
            leaks = defaultdict(list)
            for _, raw in read_topic(base_settings, topic, idle_s=1.0):
                a = decode_alert(raw)
                if a.rule in ("pipeline_stall", "checkpoint_io_storm"):
                    leaks[a.message_id].append(a)
            if sum(m.endswith(":causes") for m in leaks) >= 2:
                break
            time.sleep(3)
        time.sleep(3)
    finally:
        assert worker.stop() == 0
    assert all(len(v) == 1 for v in leaks.values()), {k: len(v) for k, v in leaks.items()}
    got = {(a.rule, a.node, a.gpu, a.state, bool(a.causes)) for [a] in leaks.values()}
    assert {("pipeline_stall", "node-00", "0", "firing", False), ("pipeline_stall", "node-00", "0", "firing", True),
            ("checkpoint_io_storm", "node-01", "host", "firing", False),
            ("checkpoint_io_storm", "node-01", "host", "firing", True)} <= got, got
    assert not [a for [a] in leaks.values() if a.gpu == "1"], "the short stalls fired"
    causes = {a.rule: [c.cause for c in a.causes] for [a] in leaks.values() if a.causes}
    assert causes["pipeline_stall"][0] == "host_cpu_util" and causes["checkpoint_io_storm"][0] == "disk_write"
    stall = next(a for [a] in leaks.values() if a.rule == "pipeline_stall")
    assert (stall.onset_ts_ns - params.start_ns) // S in range(150, 190)
    assert float(stall.evidence["cost_usd_per_h"] or 0) > 0
    # The ledger, from the same ClickHouse the worker wrote.
    res = CliRunner().invoke(cli, ["leaks", "--since", "2h", "--format", "json"], env=settings_env(base_settings))
    assert res.exit_code == 0, res.output
    ledger = {(r["rule"], r["node"]): r for r in orjson.loads(res.output)}
    assert set(ledger) == {("pipeline_stall", "node-00"), ("checkpoint_io_storm", "node-01")}
    assert ledger[("pipeline_stall", "node-00")]["cause"] == "host_cpu_util"
    assert all(r["usd"] > 0 for r in ledger.values())
