"""A broker that only speaks SASL_SSL (SCRAM-SHA-512 over TLS, a throw-away CA): ``deploy/kafka.sh start
--secure``. flopwatch's clients connect with the documented settings; a wrong password is refused with a
clear error; no password appears in any output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.kafka.admin import delete_topics, ensure_topics
from agents.settings import Settings, load_settings
from tests.integration.conftest import ROOT
from tests.integration.helpers import Worker, worker_env

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
