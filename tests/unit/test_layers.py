"""The one-way layering ``agents -> streams -> schemas``: pure layers load no I/O library and read no clock or env."""

from __future__ import annotations

import ast
import doctest
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = ("schemas", "streams")
HEAVY = ("faust", "aiokafka", "confluent_kafka", "clickhouse_driver", "chdb", "pynvml", "agents")
# Wall clock and process environment: pure code receives both as arguments.
FORBIDDEN_NAMES = {
    "os.environ", "os.environb", "os.getenv", "os.getenvb",
    "time.time", "time.time_ns", "time.monotonic", "time.monotonic_ns",
    "datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today", "datetime.date.today",
}
# Which top-level packages each pure package must never import.
FORBIDDEN_IMPORTS = {"schemas": {"streams", "agents"}, "streams": {"agents"}}


def module_names(package: str) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


def source_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_the_pure_packages_have_modules() -> None:
    assert {"schemas.codec", "schemas.catalog"} <= set(module_names("schemas"))
    assert {"streams.align.aligner", "streams.sim.simulate"} <= set(module_names("streams"))


# --- (a) importing the pure layers loads no I/O library ---------------------------------------------------------

def test_importing_schemas_and_streams_loads_no_io_library() -> None:
    modules = [m for p in PURE for m in module_names(p)]
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == [], f"importing {', '.join(PURE)} loaded {loaded}"


def test_the_import_probe_does_see_heavy_modules() -> None:
    # The same probe on an agents module must report it, or the test above proves nothing.
    code = "import sys, agents.settings; print(sorted(m for m in sys.modules if m.split('.')[0] == 'agents'))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "agents.settings" in proc.stdout


# --- (b) static checks ------------------------------------------------------------------------------------------

def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def violations(source: str, module: str, is_package: bool = False) -> tuple[set[str], set[str]]:
    """(imported modules, forbidden clock/env names used) of one module's source."""
    tree = ast.parse(source)
    imported: set[str] = set()
    aliases: dict[str, str] = {}  # local name -> dotted name it stands for
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                imported.add(a.name)
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            imported.add(base)
            for a in node.names:
                full = f"{base}.{a.name}"
                imported.add(full)
                aliases[a.asname or a.name] = full
                if full in FORBIDDEN_NAMES:
                    used.add(full)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute | ast.Name):
            parts = []
            cur: ast.expr = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if not isinstance(cur, ast.Name) or cur.id not in aliases:
                continue
            dotted = ".".join([aliases[cur.id], *reversed(parts)])
            if dotted in FORBIDDEN_NAMES:
                used.add(dotted)
    return imported, used


def _top(name: str) -> str:
    return name.split(".")[0]


def scanned(package: str) -> Iterator[tuple[Path, set[str], set[str]]]:
    """Each source file of ``package`` with what it imports and which forbidden calls it uses."""
    for path in source_files(package):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        yield path.relative_to(ROOT), *violations(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")


@pytest.mark.parametrize("package", PURE)
def test_pure_packages_import_only_downwards(package: str) -> None:
    bad = [f"{path} imports {m}" for path, imported, _ in scanned(package) for m in sorted(imported)
           if _top(m) in FORBIDDEN_IMPORTS[package] | set(HEAVY)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", PURE)
def test_pure_packages_read_no_wall_clock_or_environment(package: str) -> None:
    bad = [f"{path} uses {u}" for path, _, used in scanned(package) for u in sorted(used)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(("source", "found"), [
    ("import os\nx = os.environ['A']\n", {"os.environ"}),
    ("import os as o\nx = o.getenv('A')\n", {"os.getenv"}),
    ("from os import environ\n", {"os.environ"}),
    ("import time\nt = time.time()\n", {"time.time"}),
    ("import time as clock\nt = clock.monotonic()\n", {"time.monotonic"}),
    ("from time import monotonic as m\nt = m()\n", {"time.monotonic"}),
    ("from datetime import datetime\nt = datetime.now()\n", {"datetime.datetime.now"}),
    ("import datetime\nt = datetime.datetime.now(datetime.UTC)\n", {"datetime.datetime.now"}),
    ("import time\nt = time.perf_counter_ns\nx = {'time': 1}['time']\n", set()),
    ("def f(time: int) -> int:\n    return time\n", set()),
])
def test_the_static_checker_finds_clock_and_env_use(source: str, found: set[str]) -> None:
    assert violations(source, "streams.x")[1] == found


def test_the_static_checker_finds_upward_imports() -> None:
    imported, _ = violations("from ..agents.settings import Settings\nimport streams.align\n", "schemas.x")
    assert {"agents.settings", "streams.align"} <= imported
    imported, _ = violations("from . import align\nfrom .align import GridAligner\n", "streams.x")
    assert {"streams", "streams.align", "streams.align.GridAligner"} <= imported
    assert not any(_top(m) == "agents" for m in imported)


# --- (c) the rooms inside streams/ and agents/ ------------------------------------------------------------------

# Which sibling packages each package may import (itself always). Modules directly in streams/ or agents/
# other than these packages are not allowed in streams/; in agents/ the app, settings, metrics and web stay at the
# top (settings may be imported by every package; the app, web and metrics only by the CLI and each other).
ROOMS: dict[str, set[str]] = {
    "streams.align": set(),
    "streams.efficiency": {"streams.align", "streams.detect"},
    "streams.formats": set(),
    "streams.sim": set(),
    "streams.detect": {"streams.align", "streams.leaks", "streams.attribution"},
    "streams.attribution": set(),
    "streams.decide": {"streams.detect", "streams.policy"},
    "streams.alerting": set(),
    "streams.policy": set(),
    "streams.leaks": {"streams.policy"},
    "agents.kafka": {"agents.settings"},
    "agents.runtime": {"agents.settings", "agents.kafka"},
    "agents.sinks": {"agents.settings", "agents.kafka", "agents.runtime"},
    "agents.collect": {"agents.settings", "agents.kafka", "agents.runtime"},
    "agents.act": {"agents.settings", "agents.kafka", "agents.runtime"},
    "agents.ingest": {"agents.settings", "agents.kafka", "agents.runtime", "agents.sinks"},
    "agents.detect": {"agents.settings", "agents.kafka", "agents.runtime", "agents.sinks"},
    "agents.decide": {"agents.settings", "agents.kafka", "agents.runtime", "agents.sinks"},
    "agents.livepage": {"agents.sinks"},
}
AGENTS_TOP = {"agents.app", "agents.settings", "agents.settings_values", "agents.metrics", "agents.web"}


def _room(name: str) -> str:
    """The package (``streams.align``) or top-level module (``agents.app``) a dotted name belongs to."""
    return ".".join(name.split(".")[:2])


@pytest.mark.parametrize("package", ["streams", "agents"])
def test_both_layers_are_packages_of_packages(package: str) -> None:
    top_modules = {p.stem for p in (ROOT / package).glob("*.py") if p.name != "__init__.py"}
    allowed = {m.split(".")[1] for m in AGENTS_TOP} if package == "agents" else set()
    assert top_modules <= allowed, f"modules outside a package in {package}/: {sorted(top_modules - allowed)}"
    rooms = {p.parent.name for p in (ROOT / package).glob("*/__init__.py")}
    assert rooms == {r.split(".")[1] for r in ROOMS if r.startswith(package)} | ({"cli"} if package == "agents" else set())


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_room_has_a_docstring_and_imports_only_what_it_may(room: str) -> None:
    init = importlib.import_module(room)
    assert init.__doc__ and "Imports:" in init.__doc__, f"{room}/__init__.py must say what it holds and may import"
    package, name = room.split(".")
    bad = []
    for path, imported, _ in scanned(package):
        if path.parts[1] != name:
            continue
        for m in sorted(imported):
            if _top(m) == package and _room(m) not in {room, package} | ROOMS[room]:
                bad.append(f"{path} imports {m}")
    assert not bad, "\n".join(bad)


def test_the_room_checker_sees_a_forbidden_sibling() -> None:
    imported, _ = violations("from streams.decide.engine import Decider\n", "streams.align.aligner")
    assert any(_room(m) == "streams.decide" and _room(m) not in ROOMS["streams.align"] for m in imported)


# --- doctests -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["streams.align.aligner", "streams.sim.simulate", "schemas.codec"])
def test_doctests_pass(name: str) -> None:
    module: ModuleType = importlib.import_module(name)
    result = doctest.testmod(module, verbose=False, report=True)
    assert result.attempted >= 1, f"{name} has no runnable example"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"


def test_every_module_with_an_example_is_in_the_doctest_run() -> None:
    import tomllib

    opts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    assert "--doctest-modules" in opts["addopts"].split()
    with_examples = {p for package in ("schemas", "streams", "agents") for p in source_files(package)
                     if ">>> " in p.read_text(encoding="utf-8")}
    assert len(with_examples) > 40
    assert not {p for p in with_examples if p.relative_to(ROOT).parts[0] not in opts["testpaths"]}
