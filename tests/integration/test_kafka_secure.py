"""A broker that only speaks SASL_SSL (SCRAM-SHA-512 over TLS, a throw-away CA): ``deploy/kafka.sh start
--secure``. flopwatch's clients (the simulator, the Faust worker, ``act``, ``alerts forward``, ``replay`` and
the NVML collector) connect with the documented settings; a wrong password is refused with a clear error; no
password appears in any output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agents.kafka.admin import delete_topics, ensure_topics
from agents.kafka.producer import SampleProducer
from agents.kafka.topics import ALERTS, Topics
from agents.settings import Settings, load_settings
from schemas.alerts import alert_key, encode_alert, make_alert
from schemas.codec import decode_samples
from schemas.records import SampleBatch
from schemas.triggers import encode_trigger, make_trigger
from tests.doubles import fake_pynvml as fake
from tests.doubles.fake_pynvml import FakeNvml
from tests.integration.conftest import ROOT
from tests.integration.helpers import Worker, worker_env
from tests.integration.test_detection import read_topic

pytestmark = pytest.mark.integration

PORT = 19192


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path]]:
    """The broker's environment for kafka.sh and its directory (CA, credentials)."""
    state = tmp_path_factory.mktemp("kafka-secure")
    env = {k: v for k, v in os.environ.items() if k != "FLOPWATCH_KAFKA_BOOTSTRAP"} | {
        "FLOPWATCH_KAFKA_SECURE_DIR": str(state), "FLOPWATCH_KAFKA_SECURE_PORT": str(PORT),
        "FLOPWATCH_KAFKA_HEAP": "384m"}
    out = subprocess.run([str(ROOT / "deploy/kafka.sh"), "start", "--secure"], env=env, check=True,
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == f"127.0.0.1:{PORT}"
    password = dict(line.split("=", 1) for line in (state / "credentials.env").read_text().split())
    assert password["FLOPWATCH_KAFKA_SASL_PASSWORD"] not in out.stdout + out.stderr
    assert oct((state / "credentials.env").stat().st_mode & 0o777) == "0o600"
    try:
        yield env, state
    finally:
        subprocess.run([str(ROOT / "deploy/kafka.sh"), "stop", "--secure"], env=env, check=False, timeout=120)


def secure_settings(state: Path, password: str, tmp_path: Path) -> Settings:
    tag = os.urandom(4).hex()
    return load_settings({}, kafka_bootstrap=f"127.0.0.1:{PORT}", kafka_security_protocol="SASL_SSL",
                         kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="flopwatch",
                         kafka_sasl_password=password, kafka_ssl_cafile=str(state / "tls" / "ca.pem"),
                         topic_prefix=f"s{tag}.", group_id=f"g{tag}", partitions=2, chdb_path=str(tmp_path / "chdb"),
                         source_idle_s=1.0, flush_interval_ms=300, lateness_ms=1000, web_enabled=False)


def the_password(state: Path) -> str:
    return dict(ln.split("=", 1) for ln in (state / "credentials.env").read_text().split())["FLOPWATCH_KAFKA_SASL_PASSWORD"]


def test_the_simulator_and_the_faust_worker_work_over_sasl_ssl_and_log_no_secret(
        secure: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    _, state = secure
    password = the_password(state)
    settings = secure_settings(state, password, tmp_path)
    ensure_topics(settings)
    try:
        sim = subprocess.run([sys.executable, "-m", "agents.cli.main", "simulate", "--mode", "backlog", "--nodes", "1",
                              "--gpus", "2", "--duration", "20", "--seed", "3"], env=worker_env(settings),
                             capture_output=True, text=True, timeout=180)
        assert sim.returncode == 0, sim.stderr[-3000:]
        worker = Worker(settings, "--runtime", "faust")  # the Faust app: ingest service and detection agent
        try:
            worker.wait_for(lambda st: st["frames_written"] >= 2 * 18, timeout_s=120)
        finally:
            assert worker.stop() == 0
        logs = "".join(worker.tail) + sim.stdout + sim.stderr
        assert password not in logs
    finally:
        delete_topics(settings)


def test_a_wrong_password_is_refused_with_a_clear_error_that_shows_no_password(
        secure: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    _, state = secure
    settings = secure_settings(state, "not-the-password", tmp_path)
    proc = subprocess.run([sys.executable, "-m", "agents.cli.main", "worker"], env=worker_env(settings),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "refused the credentials of user 'flopwatch' (SCRAM-SHA-512 over SASL_SSL)" in proc.stderr
    assert "not-the-password" not in proc.stderr + proc.stdout
    assert the_password(state) not in proc.stderr + proc.stdout


def test_act_the_alert_forwarder_replay_and_the_nvml_collector_work_over_sasl_ssl(
        secure: tuple[dict[str, str], Path], service_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, state = secure
    password = the_password(state)
    settings = secure_settings(state, password, tmp_path)
    env = worker_env(settings)
    topics = Topics(settings.topic_prefix)
    ensure_topics(settings)
    logs = ""
    try:
        now = time.time_ns()
        trigger = make_trigger("scale_up", "ml", f"wl-{settings.group_id}", "inference", ts_ns=now, current=2,
                               desired=3, reasons=("qps",),
                               evidence={"qps": {"value": 900.0, "threshold": 800.0, "window_s": 30.0}})
        node = f"node-{settings.group_id}"  # unique: Alertmanager is shared with the other tests
        alert = make_alert("util_spike", "warning", node, "0", value=99.0, threshold=95.0, onset_ts_ns=now - 5 * 10**9,
                           ts_ns=now - 4 * 10**9, workload="wl", namespace="ml")
        producer = SampleProducer(settings)
        producer.send(topics.triggers, encode_trigger(trigger), key=trigger.key)
        producer.send(settings.topic_prefix + ALERTS, encode_alert(alert), key=alert_key(alert))
        producer.close()

        # act: the trigger read over SASL_SSL, its kubectl line printed once.
        act = subprocess.run([sys.executable, "-m", "agents.cli.main", "act", "--dry-run", "--from-beginning",
                              "--exit-when-idle", "2", "--state", str(tmp_path / "act.sqlite")], env=env,
                             capture_output=True, text=True, timeout=120)
        logs += act.stdout + act.stderr
        assert act.returncode == 0, act.stderr[-3000:]
        assert len(act.stdout.splitlines()) == 1 and trigger.idempotency_key in act.stdout, act.stdout

        # alerts forward: the alert read over SASL_SSL reaches the real Alertmanager.
        url = service_env["FLOPWATCH_ALERTMANAGER_URL"]
        with (tmp_path / "forward.log").open("w") as err:
            fwd = subprocess.Popen([sys.executable, "-m", "agents.cli.main", "alerts", "forward", "--alertmanager", url,
                                    "--resend-s", "1"], env=env, stdout=subprocess.PIPE, stderr=err, text=True)
            try:
                query = urllib.parse.urlencode({"filter": f'node="{node}"'})
                got: list[dict[str, object]] = []
                deadline = time.monotonic() + 60
                while not got and time.monotonic() < deadline:
                    assert fwd.poll() is None, (tmp_path / "forward.log").read_text()[-3000:]
                    with urllib.request.urlopen(f"{url}/api/v2/alerts?{query}", timeout=10) as resp:
                        got = json.loads(resp.read())
                    time.sleep(0.5)
            finally:
                fwd.send_signal(signal.SIGTERM)
                out, _ = fwd.communicate(timeout=30)
        logs += out + (tmp_path / "forward.log").read_text()
        assert fwd.returncode == 0, logs[-3000:]
        assert [(a["labels"]["alertname"], a["labels"]["alert_id"]) for a in got] == [  # type: ignore[index]
            ("util_spike", alert.id)], got

        # replay (the SDK's producer): a real nvidia-smi recording published over SASL_SSL.
        rec = ROOT / "tests/fixtures/nvsmi/h100_units.csv"
        rep = subprocess.run([sys.executable, "-m", "agents.cli.main", "replay", str(rec), "--node", "node-rec"],
                             env=env, capture_output=True, text=True, timeout=120)
        logs += rep.stdout + rep.stderr
        assert rep.returncode == 0, rep.stderr[-3000:]
        power = [decode_samples(raw, "power") for _, raw in read_topic(settings, topics.prefix + "sensors.power", idle_s=2.0)]
        assert power and all(isinstance(b, SampleBatch) and b.node == "node-rec" for b in power)

        # The NVML collector (a double of the driver's library, the rest real) publishes over SASL_SSL.
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fake.gpus(2)))
        from agents.cli.nvml import nvml_command

        nv = CliRunner().invoke(nvml_command, ["--duration", "1.5", "--proc-root", str(tmp_path)],
                                env=env | {"NODE_NAME": "node-nvml"})
        logs += nv.output
        assert nv.exit_code == 0, nv.output
        batches = [decode_samples(raw, "power") for _, raw in read_topic(settings, topics.prefix + "sensors.power", idle_s=2.0)]
        assert any(isinstance(b, SampleBatch) and b.node == "node-nvml" for b in batches)
        assert password not in logs
    finally:
        delete_topics(settings)
