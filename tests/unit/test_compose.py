"""Deployment files agree with each other: docker-compose.yml, deploy/kafka.sh, .ci/run and the README."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def service_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # the "KEY=value" form
        return dict(item.partition("=")[::2] for item in env)
    return {str(k): str(v) for k, v in env.items()}


def code_lines(path: Path) -> list[str]:
    """Shell lines without comments or blank lines."""
    return [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


def test_compose_has_the_four_services() -> None:
    services = compose()["services"]
    assert {"kafka", "clickhouse", "worker", "simulator"} <= set(services)


@pytest.mark.parametrize("name", ["worker", "simulator"])
def test_python_services_name_kafka_and_the_native_backend(name: str) -> None:
    env = service_env(compose()["services"][name])
    assert env.get("FLOPWATCH_KAFKA_BOOTSTRAP"), env
    assert env["FLOPWATCH_KAFKA_BOOTSTRAP"].split(":")[0] == "kafka"
    assert env.get("FLOPWATCH_CLICKHOUSE_BACKEND") == "native"
    assert env.get("FLOPWATCH_CLICKHOUSE_HOST") == "clickhouse"


def kafka_sh_version() -> str:
    text = (ROOT / "deploy/kafka.sh").read_text(encoding="utf-8")
    m = re.search(r'^KAFKA_VERSION="\$\{FLOPWATCH_KAFKA_VERSION:-([^}"]+)\}"', text, re.MULTILINE)
    assert m, "deploy/kafka.sh has no KAFKA_VERSION default"
    return m.group(1)


def test_kafka_image_tag_matches_the_version_pinned_in_kafka_sh() -> None:
    image = compose()["services"]["kafka"]["image"]
    repo, _, tag = image.rpartition(":")
    assert repo.endswith("kafka") and tag, image
    assert tag == kafka_sh_version()
    assert re.fullmatch(r"3\.\d+\.\d+", tag), "Kafka 4 dropped protocol versions aiokafka/faust use"


def test_ci_script_lints_type_checks_and_runs_the_test_command() -> None:
    path = ROOT / ".ci/run"
    assert path.is_file()
    assert os.access(path, os.X_OK), ".ci/run is not executable"
    lines = code_lines(path)
    assert lines and path.read_text(encoding="utf-8").startswith("#!")
    assert any(re.search(r"\bruff\s+check\b", ln) for ln in lines), lines
    assert any(re.search(r"\bmypy\b", ln) for ln in lines), lines
    tests = [i for i, ln in enumerate(lines) if re.match(r"(exec\s+)?\./deploy/test\.sh(\s|$)", ln)]
    assert tests, lines
    # Lint and types come first: a failed check stops before the slow tests.
    ruff = next(i for i, ln in enumerate(lines) if "ruff" in ln)
    mypy = next(i for i, ln in enumerate(lines) if "mypy" in ln)
    assert ruff < tests[0] and mypy < tests[0]
    assert any(re.fullmatch(r"set -[a-z]*e[a-z]*( -o pipefail)?|set -euo pipefail", ln) for ln in lines), \
        ".ci/run must stop at the first failing step"


def test_readme_gives_the_test_command_near_the_top() -> None:
    path = ROOT / "README.md"
    assert path.is_file(), "README.md is missing"
    head = path.read_text(encoding="utf-8").splitlines()[:40]
    assert any("./deploy/test.sh" in ln for ln in head), "README.md must show ./deploy/test.sh in its first 40 lines"
