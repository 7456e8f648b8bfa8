"""Labelled scenarios: efficiency drops, spikes and workload changes scheduled into a simulated run.

A scenario is a TOML file users write themselves; every event carries the label a
detector is judged by (``expect``), and ``Scenario.truth`` turns the events into
absolute times once the run's start is known. Parsing is strict: a typo in a key or a
value is an error naming the file, the event and its line, never a silently ignored
event. The simulator applies the events (``streams.sim.play``).

File format (version 1)::

    version = 1
    description = "optional text"
    duration_s = 300.0            # optional: the run the scenario is written for

    [[event]]
    kind = "efficiency_drop"      # tensor_active and sm_active x (1 - depth), power as it was
    node = "node-00"              # simulator node name, or "*" for every node
    gpu = "0"                     # GPU index as a string, or "*"
    start_s = 60.0                # seconds after the simulation start
    duration_s = 20.0
    depth = 0.25                  # in (0, 1)
    expect = "alert"              # optional: "alert" | "no_alert"

    [[event]]
    kind = "spike"                # gpu_util -> level * 100 %, sm_active -> level
    node = "node-01"
    gpu = "*"
    start_s = 90.0
    level = 1.0                   # in (0, 1]
    duration_ms = 200.0           # optional, default 200

    [[event]]
    kind = "load_change"          # the workload's load x level: activity and gpu_util scale, power follows
    node = "node-01"              # (static power stays, dynamic power ~ activity^0.6, settling in ~0.5 s):
    gpu = "0"                     # FLOPS/W falls with the load, and that is physics, not a drift
    start_s = 30.0
    duration_s = 600.0
    profile = "square"            # "step": level for the duration; "square": level and 1 alternating every
    level = 0.2                   # period_s / 2 (level first); "sine": between 1 and level with period_s;
    period_s = 50.0               # "diurnal": 1 down to level and back over the duration. level in (0, 2]

    [[event]]
    kind = "leak"                 # one of the leak rules' leaks (streams.sim.leak_effects), or a look-alike
    rule = "pipeline_stall"       # a rule name of streams.leaks
    variant = "leak"              # "leak" (default) or one of the rule's look-alikes, e.g. "short"
    node = "node-00"
    gpu = "0"                     # "*" for checkpoint_io_storm (a node's leak)
    start_s = 60.0
    duration_s = 180.0
    magnitude = 600.0             # optional, per rule (see LEAK_MAGNITUDES): wait ms, queue depth, ...
    period_s = 60.0               # optional: checkpoint_io_storm's period

    [[event]]
    kind = "workload_change"      # the GPUs' workload label changes from start_s on
    node = "node-00"
    gpu = "*"
    start_s = 150.0
    new_workload = "llm-finetune" # optional

Without ``expect``, a drop is labelled ``alert`` when it is at least ``ALERT_MIN_DEPTH``
deep and ``ALERT_MIN_DURATION_S`` long, ``no_alert`` otherwise (dips and shallow
drops); a leak is labelled ``alert`` when it lasts at least its rule's ``LEAK_MIN_S``, a
look-alike ``no_alert``; spikes, load changes and workload changes are labelled ``no_alert``.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from typing import Final, Literal, cast

from streams.sim.leak_catalog import LEAK_MAGNITUDES, LEAK_MIN_S, LEAK_VARIANTS
from streams.sim.physics import node_name

SCENARIO_VERSION: Final = 1
ANY: Final = "*"
ALERT_MIN_DEPTH: Final = 0.12
ALERT_MIN_DURATION_S: Final = 3.0
DEFAULT_SPIKE_MS: Final = 200.0

EventKind = Literal["efficiency_drop", "spike", "load_change", "workload_change", "leak"]
LoadProfile = Literal["step", "square", "sine", "diurnal"]
Expect = Literal["alert", "no_alert"]
KINDS: Final[tuple[EventKind, ...]] = ("efficiency_drop", "spike", "load_change", "workload_change", "leak")
PROFILES: Final[tuple[LoadProfile, ...]] = ("step", "square", "sine", "diurnal")
EXPECTS: Final[tuple[Expect, ...]] = ("alert", "no_alert")

_S: Final = 1_000_000_000
_TOP_KEYS: Final = frozenset({"version", "description", "duration_s", "event"})
_COMMON_KEYS: Final = ("kind", "node", "gpu", "start_s", "expect")
_KIND_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "efficiency_drop": ("duration_s", "depth"),
    "spike": ("level", "duration_ms"),
    "load_change": ("duration_s", "profile", "level", "period_s"),
    "workload_change": ("new_workload",),
    "leak": ("rule", "variant", "duration_s", "magnitude", "period_s"),
}
_NODE_RE: Final = re.compile(r"node-(\d+)")
_GPU_RE: Final = re.compile(r"0|[1-9]\d*")
# A Kubernetes label value / DNS-1123 label: what a workload name can be in a real cluster.
_WORKLOAD_RE: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_HEADER_RE: Final = re.compile(r"\s*\[\[\s*event\s*\]\]\s*(#.*)?")


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names the file, the event and its line."""

    def __init__(self, source: str, reason: str, index: int | None = None, line: int | None = None) -> None:
        where = "" if index is None else f" event[{index}]" + ("" if line is None else f" (line {line})")
        super().__init__(f"{source}:{where} {reason}")
        self.source, self.reason, self.index, self.line = source, reason, index, line


@dataclass(frozen=True, slots=True)
class ScenarioEvent:
    """One event as written; times are seconds after the simulation start."""

    index: int  # position in the file's [[event]] list
    kind: EventKind
    node: str  # a node name or ANY
    gpu: str  # a GPU index or ANY
    start_s: float
    duration_s: float  # 0 for a workload change (it lasts); a spike's duration_ms / 1000
    expect: Expect
    depth: float = 0.0  # efficiency_drop
    level: float = 0.0  # spike; load_change: the load factor
    new_workload: str | None = None  # workload_change; None: the simulator names it
    profile: LoadProfile = "step"  # load_change
    period_s: float = 0.0  # load_change "square" and "sine"; leak: checkpoint_io_storm's period
    line: int | None = None  # of the event's [[event]] header, when the file uses headers
    rule: str = ""  # leak
    variant: str = "leak"  # leak: "leak" or a look-alike
    magnitude: float = 0.0  # leak

    def covers(self, node: str, gpu: str) -> bool:
        """Whether the event concerns GPU ``gpu`` of ``node``."""
        return self.node in (ANY, node) and self.gpu in (ANY, gpu)


@dataclass(frozen=True, slots=True)
class TruthEvent:
    """An event at absolute UTC times, what detections are compared against."""

    index: int
    kind: EventKind
    node: str  # a node name or ANY
    gpu: str  # a GPU index or ANY
    start_ns: int
    end_ns: int  # exclusive; == start_ns for a workload change
    expect: Expect
    depth: float = 0.0
    level: float = 0.0
    new_workload: str | None = None
    profile: LoadProfile = "step"
    period_s: float = 0.0
    rule: str = ""
    variant: str = "leak"
    magnitude: float = 0.0

    def covers(self, node: str, gpu: str) -> bool:
        """Whether the event concerns GPU ``gpu`` of ``node``."""
        return self.node in (ANY, node) and self.gpu in (ANY, gpu)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A parsed, validated scenario.

    Examples
    --------
    >>> sc = parse_scenario('''
    ... version = 1
    ... [[event]]
    ... kind = "efficiency_drop"
    ... node = "node-00"
    ... gpu = "0"
    ... start_s = 60.0
    ... duration_s = 20.0
    ... depth = 0.25
    ... [[event]]
    ... kind = "efficiency_drop"
    ... node = "*"
    ... gpu = "*"
    ... start_s = 100.0
    ... duration_s = 2.0
    ... depth = 0.3
    ... ''', "demo.toml")
    >>> [(t.node, t.gpu, t.start_ns, t.end_ns, t.expect) for t in sc.truth(1_000 * 10**9)]
    [('node-00', '0', 1060000000000, 1080000000000, 'alert'), ('*', '*', 1100000000000, 1102000000000, 'no_alert')]
    >>> try:
    ...     parse_scenario('version = 1\\n[[event]]\\nkind = "efficiency_drop"\\nnode = "node-0"\\n', "x.toml")
    ... except ScenarioError as exc:
    ...     print(exc)
    x.toml: event[0] (line 2) node must be a simulator node name such as 'node-00' or '*', got 'node-0'
    """

    events: tuple[ScenarioEvent, ...] = ()
    source: str = "<scenario>"
    description: str = ""
    duration_s: float | None = None

    def truth(self, start_ns: int) -> list[TruthEvent]:
        """The events at absolute times for a run that starts at ``start_ns``, by start time."""
        out = [TruthEvent(e.index, e.kind, e.node, e.gpu, start_ns + _ns(e.start_s),
                          start_ns + _ns(e.start_s) + _ns(e.duration_s), e.expect, e.depth, e.level, e.new_workload,
                          e.profile, e.period_s, e.rule, e.variant, e.magnitude)
               for e in self.events]
        out.sort(key=lambda t: (t.start_ns, t.index))
        return out

    def check_cluster(self, nodes: int, gpus: int) -> None:
        """Raise ``ScenarioError`` if an event names a node or GPU the cluster does not have."""
        for e in self.events:
            if e.node != ANY and int(e.node.removeprefix("node-")) >= nodes:
                raise ScenarioError(self.source, f"node {e.node!r} is not in the cluster: it has {nodes} node(s), "
                                    f"{node_name(0)}..{node_name(nodes - 1)}", e.index, e.line)
            if e.gpu != ANY and int(e.gpu) >= gpus:
                raise ScenarioError(self.source, f"gpu {e.gpu!r} is not in the cluster: nodes have {gpus} GPU(s), "
                                    f"0..{gpus - 1}", e.index, e.line)


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    """Parse and validate a scenario's TOML text; ``source`` names it in errors."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(source, f"not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise ScenarioError(source, f"unknown top-level key(s) {', '.join(map(repr, unknown))}; "
                            f"a scenario has {', '.join(sorted(_TOP_KEYS))}")
    if "version" not in doc:
        raise ScenarioError(source, f"missing 'version' (this flopwatch reads version = {SCENARIO_VERSION})")
    version = doc["version"]
    if type(version) is not int or version != SCENARIO_VERSION:
        raise ScenarioError(source, f"unsupported version {version!r} (this flopwatch reads version = "
                            f"{SCENARIO_VERSION})")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError(source, f"description must be a string, got {description!r}")
    duration_s: float | None = None
    if "duration_s" in doc:
        duration_s = _number(doc["duration_s"], "duration_s", source, None, None)
        if duration_s <= 0:
            raise ScenarioError(source, f"duration_s must be > 0, got {duration_s!r}")
    raw = doc.get("event", [])
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ScenarioError(source, "'event' must be an array of tables: write each event under [[event]]")
    headers = [n for n, ln in enumerate(text.splitlines(), 1) if _HEADER_RE.fullmatch(ln)]
    # Headers locate events only when the file spells every event as one (not the inline-array form).
    lines: list[int | None] = list(headers) if len(headers) == len(raw) else [None] * len(raw)
    events = tuple(_event(cast(dict[str, object], t), i, lines[i], source) for i, t in enumerate(raw))
    for e in events:
        if duration_s is not None and e.start_s + e.duration_s > duration_s:
            raise ScenarioError(source, f"ends at {e.start_s + e.duration_s:g} s, after the scenario's "
                                f"duration_s = {duration_s:g}", e.index, e.line)
    _check_overlaps(events, source)
    return Scenario(events, source, description, duration_s)


def _ns(seconds: float) -> int:
    return round(seconds * _S)


def _number(value: object, key: str, source: str, index: int | None, line: int | None) -> float:
    # bool is an int to Python but never a number in a scenario.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScenarioError(source, f"{key} must be a finite number, got {value!r}", index, line)
    return float(value)


def _event(t: dict[str, object], i: int, line: int | None, source: str) -> ScenarioEvent:
    def fail(reason: str) -> ScenarioError:
        return ScenarioError(source, reason, i, line)

    def number(key: str, lo: float, hi: float, lo_open: bool = False, default: float | None = None) -> float:
        if key not in t:
            if default is None:
                raise fail(f"{kind} needs {key!r}")
            return default
        v = _number(t[key], key, source, i, line)
        if v < lo or v > hi or (lo_open and v == lo):
            bound = f"{'>' if lo_open else '>='} {lo:g}" if hi == math.inf else \
                f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise fail(f"{key} must be {bound}, got {v!r}")
        return v

    kind = t.get("kind")
    if kind not in KINDS:
        raise fail(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    allowed = (*_COMMON_KEYS, *_KIND_KEYS[cast(str, kind)])
    unknown = sorted(set(t) - set(allowed))
    if unknown:
        raise fail(f"unknown key(s) {', '.join(map(repr, unknown))}; {kind} takes {', '.join(allowed)}")
    if "node" not in t:
        raise fail("needs 'node' (a node name such as 'node-00', or '*')")
    node = t["node"]
    if not isinstance(node, str) or (node != ANY and not _is_node_name(node)):
        raise fail(f"node must be a simulator node name such as {node_name(0)!r} or '*', got {node!r}")
    if "gpu" not in t:
        raise fail("needs 'gpu' (a GPU index as a string such as \"0\", or \"*\")")
    gpu = t["gpu"]
    if not isinstance(gpu, str) or (gpu != ANY and not _GPU_RE.fullmatch(gpu)):
        raise fail(f"gpu must be a GPU index as a string such as \"0\", or \"*\", got {gpu!r}")
    start_s = number("start_s", 0.0, math.inf)
    expect_raw = t.get("expect")
    if expect_raw is not None and expect_raw not in EXPECTS:
        raise fail(f"expect must be one of {', '.join(map(repr, EXPECTS))}, got {expect_raw!r}")
    expect = expect_raw
    if kind == "efficiency_drop":
        duration_s = number("duration_s", 0.0, math.inf, lo_open=True)
        depth = number("depth", 0.0, 1.0, lo_open=True)
        if depth == 1.0:
            raise fail("depth must be < 1 (a drop to zero activity is a stalled GPU, not an efficiency drop)")
        if expect is None:
            expect = "alert" if depth >= ALERT_MIN_DEPTH and duration_s >= ALERT_MIN_DURATION_S else "no_alert"
        return ScenarioEvent(i, "efficiency_drop", node, gpu, start_s, duration_s, expect, depth=depth, line=line)
    if kind == "spike":
        level = number("level", 0.0, 1.0, lo_open=True)
        duration_ms = number("duration_ms", 0.0, math.inf, lo_open=True, default=DEFAULT_SPIKE_MS)
        return ScenarioEvent(i, "spike", node, gpu, start_s, duration_ms / 1000.0, expect or "no_alert",
                             level=level, line=line)
    if kind == "load_change":
        duration_s = number("duration_s", 0.0, math.inf, lo_open=True)
        profile = t.get("profile", "step")
        if profile not in PROFILES:
            raise fail(f"profile must be one of {', '.join(map(repr, PROFILES))}, got {profile!r}")
        level = number("level", 0.0, 2.0, lo_open=True)
        periodic = profile in ("square", "sine")
        if periodic and "period_s" not in t:
            raise fail(f"a {profile} load_change needs 'period_s'")
        if not periodic and "period_s" in t:
            raise fail(f"period_s is for the square and sine profiles, not {profile!r}")
        period_s = number("period_s", 0.0, math.inf, lo_open=True) if periodic else 0.0
        return ScenarioEvent(i, "load_change", node, gpu, start_s, duration_s, expect or "no_alert", level=level,
                             profile=profile, period_s=period_s, line=line)
    if kind == "leak":
        rule = t.get("rule")
        if rule not in LEAK_MAGNITUDES:
            raise fail(f"rule must be one of {', '.join(map(repr, LEAK_MAGNITUDES))}, got {rule!r}")
        variant = t.get("variant", "leak")
        if variant not in LEAK_VARIANTS[rule]:
            raise fail(f"variant of {rule} must be one of {', '.join(map(repr, LEAK_VARIANTS[rule]))}, "
                       f"got {variant!r}")
        duration_s = number("duration_s", 0.0, math.inf, lo_open=True)
        magnitude = number("magnitude", 0.0, math.inf, lo_open=True, default=LEAK_MAGNITUDES[rule] or 1.0)
        period_s = number("period_s", 5.0, 3600.0, default=60.0) if rule == "checkpoint_io_storm" else 0.0
        if rule != "checkpoint_io_storm" and "period_s" in t:
            raise fail("period_s is for checkpoint_io_storm")
        if rule == "checkpoint_io_storm" and gpu != ANY:
            raise fail('a checkpoint_io_storm is a node\'s leak: gpu must be "*"')
        if expect is None:
            expect = "alert" if variant == "leak" and duration_s >= LEAK_MIN_S[rule] else "no_alert"
        return ScenarioEvent(i, "leak", node, gpu, start_s, duration_s, expect, line=line, rule=rule,
                             variant=variant, magnitude=magnitude, period_s=period_s)
    new = t.get("new_workload")
    if new is not None and not (isinstance(new, str) and _WORKLOAD_RE.fullmatch(new)):
        raise fail(f"new_workload must be a Kubernetes name (lowercase letters, digits, '-', at most 63), "
                   f"got {new!r}")
    return ScenarioEvent(i, "workload_change", node, gpu, start_s, 0.0, expect or "no_alert",
                         new_workload=new, line=line)


def _check_overlaps(events: tuple[ScenarioEvent, ...], source: str) -> None:
    """Events of one kind (leaks: of one rule) must not overlap on a GPU: stacked drops would make the labelled
    depth wrong."""
    for k, b in enumerate(events):
        for a in events[:k]:
            if a.kind != b.kind or a.rule != b.rule or not _targets_meet(a, b):
                continue
            if b.kind == "workload_change":
                clash = a.start_s == b.start_s
            else:
                clash = a.start_s < b.start_s + b.duration_s and b.start_s < a.start_s + a.duration_s
            if clash:
                where = "" if a.line is None else f" (line {a.line})"
                raise ScenarioError(source, f"{b.kind} overlaps event[{a.index}]{where} on the same GPU(s): "
                                    "events of one kind must not overlap", b.index, b.line)


def _targets_meet(a: ScenarioEvent, b: ScenarioEvent) -> bool:
    return (ANY in (a.node, b.node) or a.node == b.node) and (ANY in (a.gpu, b.gpu) or a.gpu == b.gpu)


def _is_node_name(name: str) -> bool:
    # node_name pads to two digits, so "node-0" and "node-000" name no node: only its own spelling counts.
    m = _NODE_RE.fullmatch(name)
    return m is not None and node_name(int(m.group(1))) == name
