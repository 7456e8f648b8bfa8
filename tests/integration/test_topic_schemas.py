"""Every message the pipeline really carries validates against its topic's JSON Schema.

The simulator publishes a backlog (all 23 sensor topics, k8s.events, clock.sync with GPU
clock domains, a spike that alerts); the Faust worker turns it into frames, workload
summaries and alerts. Every message read back from every topic is validated with the
``jsonschema`` package against ``schemas.topic_schemas.schema_for``.
"""

from __future__ import annotations

import time

import jsonschema
import orjson
import pytest

from agents.collect.simulator import SimulatorPublisher
from agents.kafka.topics import Topics
from agents.settings import Settings
from schemas.topic_schemas import schema_for
from streams.sim.scenario import parse_scenario
from streams.sim.simulate import SimParams
from tests.integration.helpers import Worker
from tests.integration.test_detection import read_to_end, read_topic

pytestmark = pytest.mark.integration
S = 1_000_000_000
SPIKE = """
version = 1
[[event]]
kind = "spike"
node = "node-00"
gpu = "1"
start_s = 8.2
level = 0.99
"""


def test_every_message_on_every_topic_validates_against_its_schema(base_settings: Settings) -> None:
    duration = 20.0
    params = SimParams(nodes=2, gpus=2, seed=11, start_ns=(time.time_ns() - int(duration * S)) // S * S, steady=True)
    SimulatorPublisher(base_settings, params, batch_size=25, clock_domains=True,
                       scenario=parse_scenario(SPIKE, "test")).backlog(duration)
    topics = Topics(base_settings.topic_prefix)
    worker = Worker(base_settings, "--runtime", "faust")
    try:
        worker.wait_for(lambda st: st["frames_written"] > 0 and st.get("detect", {}).get("frames", 0) > 10)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(read_topic(base_settings, topics.alerts, idle_s=1.0)) < 2:
            time.sleep(1)
    finally:
        assert worker.stop() == 0

    counts: dict[str, int] = {}
    # The dead-letter topic holds raw bytes of rejects: its schema accepts anything (and this run has none).
    everything = read_to_end(base_settings, [t for t in topics.all if t != topics.dlq])
    for topic, msgs in everything.items():
        name = topic.removeprefix(base_settings.topic_prefix)
        validator = jsonschema.Draft202012Validator(schema_for(name))
        for raw in msgs:
            errors = list(validator.iter_errors(orjson.loads(raw)))
            assert not errors, f"{name}: {errors[0].message} at {list(errors[0].absolute_path)} in {raw[:300]!r}"
        counts[name] = len(msgs)
    empty = sorted(t for t, n in counts.items() if n == 0)
    # Every input topic, the frames, the workload summaries and the alerts carried messages;
    # triggers need a decision, which a 20 s run rarely makes.
    assert set(empty) <= {"flopwatch.triggers"}, (empty, counts)
