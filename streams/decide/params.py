"""Every threshold, window and policy of the decision engine, with the seeds' numbers as defaults.

A policy file (TOML, ``FLOPWATCH_DECIDE_POLICY``) overrides any of them; parsing is
strict, so a misspelt key is an error naming the file and the key, never a rule that
silently keeps its default::

    [rules]
    sm_active_up = 0.75          # scale up: mean SM activity >= this ...
    sm_active_up_s = 60          # ... for this long
    [classes.inference]
    weight = 2.0
    [namespaces.serving]
    min_replicas = 2
    max_replicas = 16
    qos = "burstable"

>>> p = parse_decide_policy({"rules": {"qps_up": 500}, "namespaces": {"serving": {"max_replicas": 8}}}, "policy.toml")
>>> p.rules.qps_up, p.namespace("serving").max_replicas, p.namespace("other").max_replicas
(500.0, 8, 1000)
>>> try:
...     parse_decide_policy({"rules": {"qps_upp": 1}}, "policy.toml")
... except PolicyError as exc:
...     print(str(exc)[:52])
policy.toml: [rules] has no key 'qps_upp' (known: ch
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from streams.policy.tables import PolicyError, build_section, check_keys
from streams.policy.tables import table as as_table

Qos = Literal["guaranteed", "burstable", "best_effort"]
QOS: Final[tuple[str, ...]] = get_args(Qos)
S: Final = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Rules:
    # Scale up (seed 001 §1, seed 000 §5): any one of these.
    sm_active_up: float = 0.75
    sm_active_up_s: float = 60.0
    pcie_up: float = 0.90  # of the link's capacity per direction
    pcie_up_s: float = 30.0
    nccl_ms_up: float = 12.0
    nccl_up_s: float = 10.0
    latency_p95_up_ms: float = 120.0  # online classes only
    latency_window_s: float = 30.0
    qps_up: float = 800.0  # per replica, online classes only
    qps_window_s: float = 30.0
    # Scale down: SM activity below this at each metrics check, N checks in a row (the class's down_checks).
    sm_active_down: float = 0.30
    check_interval_s: float = 10.0
    spike_window_s: float = 60.0  # no L1 spike within this before a scale-down
    sla_headroom: float = 0.8  # the SLA gate wants p95 <= headroom x SLA, and the qps rule not tripped after it
    # L3 (seed 001 §3.3).
    stabilisation_s: float = 300.0  # scale-down uses the highest recommendation within this (HPA's default)
    cooldown_s: float = 300.0  # no opposite action within this after an action
    repeat_s: float = 60.0  # no same-direction action within this (new replicas warm up)
    rate_per_min: float = 6.0  # token bucket of the whole engine (one decide partition)
    rate_burst: float = 10.0
    # Staleness (seed 001 §2.5).
    forget_node_s: float = 600.0  # ... and after this it is taken as gone
    max_age_s: float = 30.0  # a tick older than this (wall clock, past its end) is too old to act on
    tick_grace_s: float = 30.0  # a tick waits this long (event time) for a node that is behind; as max_age_s
    # Rollback (seed 001 §4.2).
    watch_s: float = 120.0
    # Rebalance (a restart or move): one per workload per this (None: cooldown_s), and never while the
    # workload's mean power moved more than rebalance_load_move (relative) within rebalance_load_s.
    rebalance_cooldown_s: float | None = None
    rebalance_load_s: float = 30.0
    rebalance_load_move: float = 0.10


@dataclass(frozen=True, slots=True)
class ClassPolicy:
    """L2 (seed 001 §3.2): what a workload class may do."""

    online: bool = False  # latency and qps rules, and the SLA, apply
    sla_latency_ms: float | None = None
    scale_down: bool = True
    max_step_up: int = 1
    max_step_down: int = 1
    down_checks: int = 6  # the metrics gate: this many passing checks in a row
    weight: float = 1.0  # an action costs 1 / weight tokens of the L3 rate limit


@dataclass(frozen=True, slots=True)
class NamespacePolicy:
    """Quota and QoS (seed 001 §4.4): replicas stay within [min, max]; guaranteed never scales down."""

    min_replicas: int = 1
    max_replicas: int = 1000
    qos: Qos = "burstable"


def _default_classes() -> dict[str, ClassPolicy]:
    return {
        "inference": ClassPolicy(online=True, sla_latency_ms=120.0, max_step_up=4, down_checks=6, weight=2.0),
        # Shrinking a training job restarts it from a checkpoint: only on request.
        "training": ClassPolicy(scale_down=False, max_step_up=1, down_checks=12, weight=1.0),
        "batch": ClassPolicy(max_step_up=2, max_step_down=2, down_checks=3, weight=0.5),
        "default": ClassPolicy(scale_down=False),
    }


@dataclass(frozen=True, slots=True)
class DecideParams:
    rules: Rules = field(default_factory=Rules)
    classes: Mapping[str, ClassPolicy] = field(default_factory=_default_classes)
    namespaces: Mapping[str, NamespacePolicy] = field(default_factory=dict)
    default_namespace: NamespacePolicy = field(default_factory=NamespacePolicy)
    max_workloads: int = 100_000

    def policy(self, workload_class: str) -> ClassPolicy:
        return self.classes.get(workload_class) or self.classes.get("default") or ClassPolicy(scale_down=False)

    def namespace(self, name: str) -> NamespacePolicy:
        return self.namespaces.get(name, self.default_namespace)


def parse_decide_policy(obj: Mapping[str, Any], source: str) -> DecideParams:
    """Build ``DecideParams`` from a parsed TOML document; ``source`` names it in errors."""
    check_keys(obj, {"rules", "classes", "namespaces", "default_namespace"}, source, "top level")
    rules = _build(Rules, obj.get("rules", {}), source, "[rules]")
    classes = dict(_default_classes())
    for name, tab in as_table(obj.get("classes", {}), source, "[classes]").items():
        base = classes.get(name, ClassPolicy())
        classes[name] = _build(ClassPolicy, tab, source, f"[classes.{name}]", base)
    spaces = {name: _build(NamespacePolicy, t, source, f"[namespaces.{name}]")
              for name, t in as_table(obj.get("namespaces", {}), source, "[namespaces]").items()}
    default_ns = _build(NamespacePolicy, obj.get("default_namespace", {}), source, "[default_namespace]")
    for where, ns in [("[default_namespace]", default_ns), *((f"[namespaces.{n}]", v) for n, v in spaces.items())]:
        if not 0 <= ns.min_replicas <= ns.max_replicas:
            raise PolicyError(f"{source}: {where} needs 0 <= min_replicas <= max_replicas")
        if ns.qos not in QOS:
            raise PolicyError(f"{source}: {where} qos must be one of {', '.join(QOS)}, got {ns.qos!r}")
    return DecideParams(rules, classes, spaces, default_ns)


# Divisors and windows: zero would divide by zero or make a rule hold on nothing.
_POSITIVE: Final = frozenset({
    "sm_active_up", "sm_active_up_s", "pcie_up", "pcie_up_s", "nccl_ms_up", "nccl_up_s", "latency_p95_up_ms",
    "latency_window_s", "qps_up", "qps_window_s", "check_interval_s", "max_age_s", "weight", "sla_latency_ms",
    "forget_node_s"})


def _build(cls: Any, obj: Any, source: str, where: str, base: Any = None) -> Any:
    return build_section(cls, obj, source, where, base, _POSITIVE)
