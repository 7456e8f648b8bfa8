"""Settings: read once from ``FLOPWATCH_*`` environment variables and an optional TOML file.

The file is named by ``FLOPWATCH_CONFIG`` (or passed explicitly); the environment wins
over the file. Secrets are ``Secret`` objects whose repr never shows the value.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from agents.settings_values import Secret, SettingsError, convert
from schemas.cluster import alt_hosts, check_cluster
from schemas.rollups import RETENTION_DAYS as ROLLUP_RETENTION_DAYS
from schemas.tiers import Tiering
from streams.align.aligner import AlignParams
from streams.attribution.rank import AttributionParams
from streams.decide.params import DecideParams, parse_decide_policy
from streams.detect.detectors import DetectParams
from streams.detect.drift_params import DriftParams
from streams.detect.spike_rule import SPIKE_THRESHOLDS
from streams.leaks.params import LeakParams, parse_leak_policy
from streams.policy.tables import PolicyError

__all__ = ["ENV_PREFIX", "Secret", "Settings", "SettingsError", "load_settings", "settings_env"]

ENV_PREFIX = "FLOPWATCH_"
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
Backend = Literal["chdb", "native"]
# The pure parameters' own defaults: the options below restate none of them.
_ALIGN: Final = AlignParams()
_DRIFT: Final = DriftParams()


@dataclass(frozen=True, slots=True)
class Settings:
    """Every option of flopwatch. Environment variable: ``FLOPWATCH_<NAME upper-cased>``."""

    kafka_bootstrap: str = "127.0.0.1:9092"
    """Kafka bootstrap servers. Default ``127.0.0.1:9092``; FLOPWATCH_KAFKA_BOOTSTRAP."""
    kafka_security_protocol: SecurityProtocol = "PLAINTEXT"
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; FLOPWATCH_KAFKA_SECURITY_PROTOCOL."""
    kafka_sasl_mechanism: SaslMechanism = "PLAIN"
    """SASL mechanism when SASL is on; FLOPWATCH_KAFKA_SASL_MECHANISM."""
    kafka_sasl_username: str = ""
    """SASL user; FLOPWATCH_KAFKA_SASL_USERNAME."""
    kafka_sasl_password: Secret = dataclasses.field(default_factory=lambda: Secret(""))
    """SASL password (never logged); FLOPWATCH_KAFKA_SASL_PASSWORD."""
    kafka_ssl_cafile: str = ""
    """CA bundle for TLS; FLOPWATCH_KAFKA_SSL_CAFILE."""
    kafka_ssl_certfile: str = ""
    """Client certificate for mutual TLS; FLOPWATCH_KAFKA_SSL_CERTFILE."""
    kafka_ssl_keyfile: str = ""
    """Client key for mutual TLS; FLOPWATCH_KAFKA_SSL_KEYFILE."""
    kafka_session_timeout_s: float = 10.0
    """How long a worker that stopped heartbeating (SIGKILLed, its host gone) keeps its partitions before the
    group hands them to the others, for the ingest consumer and the Faust app alike (Faust's own default, 60 s,
    kept a new worker waiting a minute after a SIGKILL); 6-300 (the broker's usual bounds);
    FLOPWATCH_KAFKA_SESSION_TIMEOUT_S."""
    topic_prefix: str = ""
    """Prepended to every topic name (e.g. ``staging.``); default none; FLOPWATCH_TOPIC_PREFIX."""
    partitions: int = 4
    """Partitions of every topic (all must match for co-partitioning); FLOPWATCH_PARTITIONS."""
    replication: int = 1
    """Replication factor for topics flopwatch creates (3 on a cluster); FLOPWATCH_REPLICATION."""
    min_insync_replicas: int = 0
    """``min.insync.replicas`` of the topics flopwatch creates: how many replicas must have a write before
    it counts (every producer asks for all of them); 0: one less than the replication, at most 2;
    FLOPWATCH_MIN_INSYNC_REPLICAS."""
    group_id: str = "flopwatch-ingest"
    """Consumer group of the ingest workers; FLOPWATCH_GROUP_ID."""

    clickhouse_backend: Backend = "chdb"
    """``chdb`` (embedded, default) or ``native`` (a server); FLOPWATCH_CLICKHOUSE_BACKEND."""
    chdb_path: str = ".flopwatch/chdb"
    """Data directory of the embedded backend; FLOPWATCH_CHDB_PATH."""
    clickhouse_host: str = "127.0.0.1"
    """ClickHouse server host; FLOPWATCH_CLICKHOUSE_HOST."""
    clickhouse_port: int = 9000
    """Native protocol port (9440 usual with TLS); FLOPWATCH_CLICKHOUSE_PORT."""
    clickhouse_user: str = "default"
    """ClickHouse user; FLOPWATCH_CLICKHOUSE_USER."""
    clickhouse_password: Secret = dataclasses.field(default_factory=lambda: Secret(""))
    """ClickHouse password (never logged); FLOPWATCH_CLICKHOUSE_PASSWORD."""
    clickhouse_secure: bool = False
    """TLS to the ClickHouse server; FLOPWATCH_CLICKHOUSE_SECURE."""
    clickhouse_ca_certs: str = ""
    """CA bundle for ClickHouse TLS; FLOPWATCH_CLICKHOUSE_CA_CERTS."""
    clickhouse_database: str = "flopwatch"
    """Database holding flopwatch's tables; FLOPWATCH_CLICKHOUSE_DATABASE."""
    clickhouse_layout: Literal["current", "legacy"] = "current"
    """``legacy`` writes the simplified layout old servers (18.x) accept; FLOPWATCH_CLICKHOUSE_LAYOUT."""
    clickhouse_cluster: str = ""
    """A cluster of the server's ``remote_servers``: tables become ReplicatedMergeTree ``<name>_local`` plus a
    Distributed ``<name>``, made ON CLUSTER (native backend only); empty: one server;
    FLOPWATCH_CLICKHOUSE_CLUSTER."""
    clickhouse_alt_hosts: str = ""
    """Other servers of the cluster, ``host:port,host:port``, tried in turn when the first cannot be reached;
    FLOPWATCH_CLICKHOUSE_ALT_HOSTS."""

    grid_ms: int = _ALIGN.grid_ns // 1_000_000
    """Grid step, 100 ms to 60 s; FLOPWATCH_GRID_MS."""
    lateness_ms: int = _ALIGN.allowed_lateness_ns // 1_000_000
    """Allowed lateness behind a node's watermark; FLOPWATCH_LATENESS_MS."""
    source_idle_s: float = _ALIGN.idle_ns / 1e9
    """A topic-partition or series that fell behind holds the watermark until it has been quiet this
    long while Kafka confirmed it caught up; a node quiet this long has its cells written
    (``streams.align.holds``); FLOPWATCH_SOURCE_IDLE_S."""
    step_idle_s: float = _ALIGN.step_idle_ns / 1e9
    """The same bound for a live node's per-step streams (torch, NCCL, dataloader), which pause with
    their job (``streams.align.steps``); FLOPWATCH_STEP_IDLE_S."""
    node_forget_s: float = _ALIGN.forget_ns / 1e9
    """A node whose streams have all been quiet this long (while Kafka confirmed them caught up), with no open
    cell, is forgotten by the aligner: bounded memory when nodes come and go (``streams.align.forget``); at
    least FLOPWATCH_SOURCE_IDLE_S; FLOPWATCH_NODE_FORGET_S."""
    max_age_s: float = 7 * 86400.0
    """UTC samples older than this are rejected ``too_old``; FLOPWATCH_MAX_AGE_S."""
    frames_retention_days: int = 400
    """How long ClickHouse keeps ``gpu_frames`` rows (the table's TTL, changed on an existing table at
    start); frames older than this are dropped by the server, and the worker says so with counts;
    FLOPWATCH_FRAMES_RETENTION_DAYS."""
    rollups: bool = True
    """Keep the 1 min and 1 h rollups of ``gpu_frames`` (materialized views; the current layout only);
    FLOPWATCH_ROLLUPS."""
    rollup_1m_retention_days: int = ROLLUP_RETENTION_DAYS[0]
    """How long ``gpu_rollup_1m`` keeps its rows; FLOPWATCH_ROLLUP_1M_RETENTION_DAYS."""
    rollup_1h_retention_days: int = ROLLUP_RETENTION_DAYS[1]
    """How long ``gpu_rollup_1h`` keeps its rows (the warm and cold tiers outlive the raw frames);
    FLOPWATCH_ROLLUP_1H_RETENTION_DAYS."""
    storage_policy: str = ""
    """A storage policy of the server for the frames and rollups (empty: the server's default);
    FLOPWATCH_STORAGE_POLICY."""
    hot_days: int = 7
    """With a storage policy: parts older than this move to its cold volume; FLOPWATCH_HOT_DAYS."""
    cold_volume: str = "cold"
    """With a storage policy: the volume old parts move to; FLOPWATCH_COLD_VOLUME."""
    chdb_config: str = ""
    """A ClickHouse configuration file for the embedded chDB (its disks and storage policies);
    FLOPWATCH_CHDB_CONFIG."""
    max_future_s: float = 300.0
    """UTC samples further ahead than this are rejected ``too_new``; FLOPWATCH_MAX_FUTURE_S."""
    clock_wait_s: float = 10.0
    """How long a clock-domain sample waits for a later beacon before ``no_clock``; FLOPWATCH_CLOCK_WAIT_S."""
    flush_interval_ms: int = 1000
    """Longest time frames wait before a ClickHouse insert; FLOPWATCH_FLUSH_INTERVAL_MS."""
    flush_rows: int = 20000
    """Insert as soon as this many rows wait; FLOPWATCH_FLUSH_ROWS."""
    max_poll_records: int = 20000
    """Most Kafka records taken per poll; FLOPWATCH_MAX_POLL_RECORDS."""
    max_open_samples: int = 4_000_000
    """Most samples a partition's open cells hold (~64 bytes each): past a quarter of it, topics read ahead of
    the slowest wait in Kafka; past it, the oldest ticks close and their stragglers are late;
    FLOPWATCH_MAX_OPEN_SAMPLES."""
    price_book: str = ""
    """Path of the price book TOML (re-read when edited); empty: the shipped example prices; FLOPWATCH_PRICE_BOOK."""
    derive: bool = True
    """Fill the efficiency, cost and spike columns of every frame (streams.efficiency.derive); FLOPWATCH_DERIVE."""
    publish_frames: bool = True
    """Publish closed frames to flopwatch.frames, which the detection agent reads; FLOPWATCH_PUBLISH_FRAMES."""
    drift_drop: float = _DRIFT.drop
    """Efficiency drift: how far below its baseline FLOPS/Watt must fall (fraction); FLOPWATCH_DRIFT_DROP."""
    drift_floor: float = _DRIFT.floor
    """Efficiency drift: a drop shallower than this never alerts (must be below the drop); FLOPWATCH_DRIFT_FLOOR."""
    drift_hold_s: float = _DRIFT.hold_ns / 1e9
    """Efficiency drift: how long the drop must hold, event time; FLOPWATCH_DRIFT_HOLD_S."""
    drift_baseline_s: float = _DRIFT.baseline_ns / 1e9
    """Efficiency drift: the baseline is the median over this much recent history; FLOPWATCH_DRIFT_BASELINE_S."""
    drift_detector: Literal["page_hinkley", "adwin"] = _DRIFT.detector
    """River detector giving the change's onset and the re-learn signal; FLOPWATCH_DRIFT_DETECTOR."""
    spike_util_pct: float = SPIKE_THRESHOLDS["gpu_util"]
    """L1 spike rule: sliding-window P99 of gpu_util above this (%); FLOPWATCH_SPIKE_UTIL_PCT."""
    spike_sm_active: float = SPIKE_THRESHOLDS["sm_active"]
    """L1 spike rule: sliding-window P99 of sm_active above this (ratio); FLOPWATCH_SPIKE_SM_ACTIVE."""
    attribution: bool = True
    """Follow each firing alert with its likely causes (a second message with the same id; docs/leaks.md);
    FLOPWATCH_ATTRIBUTION."""
    detect_replay_s: float = 180.0
    """Frames replayed (event time) to rebuild detector state after a restart or rebalance; at least what the
    enabled leak rules need (``LeakParams.history_s``: 1,020 s with the default policy); FLOPWATCH_DETECT_REPLAY_S."""

    web_enabled: bool = True
    """Serve ``/metrics`` (Prometheus) and ``/keda`` (KEDA metrics-api) from the worker; FLOPWATCH_WEB_ENABLED."""
    web_bind: str = "127.0.0.1"
    """Address the web server listens on (``0.0.0.0`` in a pod); FLOPWATCH_WEB_BIND."""
    web_port: int = 6066
    """Port of the web server; FLOPWATCH_WEB_PORT."""
    decide: bool = True
    """Run the decision agent (scale triggers to flopwatch.triggers, rows to scale_decisions); FLOPWATCH_DECIDE."""
    decide_policy: str = ""
    """Path of the decision policy TOML (thresholds, windows, classes, namespace quotas; streams.decide.params);
    empty: the defaults; FLOPWATCH_DECIDE_POLICY."""
    decide_replay_s: float = 900.0
    """Workload summaries replayed (event time) to rebuild decision state: must cover the stabilisation
    window, the cooldown and the rollback watch; FLOPWATCH_DECIDE_REPLAY_S."""

    leak_policy: str = ""
    """Path of the leak policy TOML (``[leaks.<rule>]`` thresholds and windows, ``enabled = false`` to turn a
    rule off; streams.leaks.params); empty: the defaults; FLOPWATCH_LEAK_POLICY."""

    def decide_params(self) -> DecideParams:
        """The decision policy: the defaults, or the policy file; a bad file is a ``SettingsError``."""
        if not self.decide_policy:
            return DecideParams()
        return _policy("decide_policy", self.decide_policy, parse_decide_policy)

    def leak_params(self) -> LeakParams:
        """The leak policy: the defaults, or the policy file; a bad file is a ``SettingsError``."""
        if not self.leak_policy:
            return LeakParams()
        return _policy("leak_policy", self.leak_policy, parse_leak_policy)

    def rollup_days(self) -> tuple[int, int] | None:
        """The 1 min and 1 h rollups' retention in days, or None when the rollups are off."""
        return (self.rollup_1m_retention_days, self.rollup_1h_retention_days) if self.rollups else None

    def tiering(self) -> Tiering | None:
        """The frames' and rollups' hot and cold tiers, or None without a storage policy."""
        if not self.storage_policy:
            return None
        return Tiering(self.storage_policy, self.hot_days, self.cold_volume)

    def min_insync(self) -> int:
        """The topics' ``min.insync.replicas``: the setting, or by default one less than the replication
        (at least 1, at most 2), so a cluster of three accepts writes with one broker down."""
        return self.min_insync_replicas or max(1, min(2, self.replication - 1))

    def align_params(self) -> AlignParams:
        return AlignParams(
            grid_ns=self.grid_ms * 1_000_000,
            allowed_lateness_ns=self.lateness_ms * 1_000_000,
            idle_ns=int(self.source_idle_s * 1e9),
            step_idle_ns=int(self.step_idle_s * 1e9),
            forget_ns=int(self.node_forget_s * 1e9),
            max_open_samples=self.max_open_samples,
            remember_ns=max(int(self.max_age_s * 1e9), int(self.node_forget_s * 1e9)),
        )

    def detect_params(self) -> DetectParams:
        baseline_ns = int(self.drift_baseline_s * 1e9)
        return DetectParams(
            drift=DriftParams(drop=self.drift_drop, floor=self.drift_floor, hold_ns=int(self.drift_hold_s * 1e9),
                              baseline_ns=baseline_ns,
                              min_baseline_ns=min(baseline_ns, _DRIFT.min_baseline_ns), detector=self.drift_detector),
            spike_thresholds={"gpu_util": self.spike_util_pct, "sm_active": self.spike_sm_active},
            leaks=self.leak_params(),
            attribution=AttributionParams(enabled=self.attribution),
        )

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict[str, str]:
        """All options as text, secrets masked: safe to log."""
        return {f.name: repr(getattr(self, f.name)) for f in fields(self)}


_P = TypeVar("_P")


def _policy(option: str, path: str, parse: Callable[[Mapping[str, Any], str], _P]) -> _P:
    """A policy file read and parsed; any fault is a ``SettingsError`` naming the option and the file."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise SettingsError(f"{option}: cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{option}: {path}: {exc}") from None
    try:
        return parse(doc, path)
    except PolicyError as exc:
        raise SettingsError(str(exc)) from None


def load_settings(env: Mapping[str, str] | None = None, config_file: str | Path | None = None,
                  **overrides: Any) -> Settings:
    """Build settings from (lowest to highest) defaults, the TOML file, the environment, overrides."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(Settings)
    known = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {}
    for old, new in _RETIRED.items():
        if ENV_PREFIX + old.upper() in env:
            raise SettingsError(f"{ENV_PREFIX}{old.upper()} is gone: {new}")
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"cannot read config file {path}: {exc}") from None
        section = data.get("flopwatch", data)
        for key, raw in section.items():
            if key in _RETIRED:
                raise SettingsError(f"setting {key!r} in {path} is gone: {_RETIRED[key]}")
            if key not in known:
                raise SettingsError(f"unknown setting {key!r} in {path}")
            values[key] = raw
    for key in known:
        raw = env.get(ENV_PREFIX + key.upper())
        if raw is not None:
            values[key] = raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = set(values) - known
    if unknown:
        raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    converted = {k: convert(k, hints[k], v) for k, v in values.items()}
    settings = Settings(**converted)
    try:
        settings.align_params()  # validates the grid, lateness and idle bounds now, not at first use
    except (ValueError, OverflowError) as exc:
        raise SettingsError(_in_settings_terms(str(exc), settings)) from None
    try:
        settings.detect_params()  # drift and spike settings, checked as a whole
    except (ValueError, OverflowError) as exc:
        raise SettingsError(f"drift/spike settings: {exc}") from None
    for name in _POSITIVE:
        if getattr(settings, name) <= 0:
            raise SettingsError(f"{name}={getattr(settings, name)!r}: must be > 0")
    if not 6.0 <= settings.kafka_session_timeout_s <= 300.0:
        raise SettingsError(f"kafka_session_timeout_s={settings.kafka_session_timeout_s!r}: must be 6-300 s (a "
                            f"broker refuses a group session outside group.min/max.session.timeout.ms)")
    if not 0 <= settings.min_insync_replicas <= settings.replication:
        raise SettingsError(f"min_insync_replicas={settings.min_insync_replicas}: must be between 1 and the "
                            f"replication ({settings.replication}), or 0 for the default")
    _check_storage(settings)
    return settings


# AlignParams' fields and the settings that set them: its errors are told in the names a user wrote.
_ALIGN_SETTINGS: Final = {"grid_ns": "grid_ms", "allowed_lateness_ns": "lateness_ms", "idle_ns": "source_idle_s",
                          "step_idle_ns": "step_idle_s", "forget_ns": "node_forget_s", "remember_ns": "max_age_s"}
_ALIGN_FIELD = re.compile(r"\b(" + "|".join(_ALIGN_SETTINGS) + r")\b")


def _in_settings_terms(message: str, settings: Settings) -> str:
    """An ``AlignParams`` error with its fields named as settings, and their values.

    >>> print(_in_settings_terms("grid_ns must be between 100 ms and 60 s", Settings(grid_ms=50)))
    FLOPWATCH_GRID_MS must be between 100 ms and 60 s (FLOPWATCH_GRID_MS=50)
    """
    named: dict[str, None] = {}

    def env_name(m: re.Match[str]) -> str:
        key = _ALIGN_SETTINGS[m.group(1)]
        named[key] = None
        return ENV_PREFIX + key.upper()

    text = _ALIGN_FIELD.sub(env_name, message)
    values = ", ".join(f"{ENV_PREFIX}{k.upper()}={getattr(settings, k):g}" for k in named)
    return f"{text} ({values})" if values else f"aligner settings: {text}"


def _check_storage(s: Settings) -> None:
    """Cluster, alternate hosts and tiers: what the schema and the driver would refuse later, refused now."""
    def tiers() -> None:
        if (t := s.tiering()) is not None:  # its constructor checks the names
            t.check(s.clickhouse_layout, {"gpu_frames": s.frames_retention_days, **dict(zip(
                ("gpu_rollup_1m", "gpu_rollup_1h"), s.rollup_days() or (), strict=False))})

    for var, check in (("CLICKHOUSE_CLUSTER", lambda: check_cluster(s.clickhouse_cluster, s.clickhouse_backend)),
                       ("CLICKHOUSE_ALT_HOSTS", lambda: alt_hosts(s.clickhouse_alt_hosts)), ("STORAGE_POLICY", tiers)):
        try:
            check()
        except ValueError as exc:
            raise SettingsError(f"{ENV_PREFIX}{var}: {exc}") from None


# Settings that were replaced, and by what: a silently ignored setting would be worse than an error.
_RETIRED = {
    "idle_series_s": "a series now holds the watermark by wall time, not event time; use FLOPWATCH_SOURCE_IDLE_S",
    "idle_flush_s": "a node's cells are written once its streams were quiet for FLOPWATCH_SOURCE_IDLE_S",
}

_POSITIVE = ("partitions", "replication", "flush_interval_ms", "flush_rows", "max_poll_records", "max_open_samples",
             "grid_ms", "source_idle_s", "step_idle_s", "node_forget_s", "max_age_s", "max_future_s", "clickhouse_port",
             "clock_wait_s", "frames_retention_days", "rollup_1m_retention_days", "rollup_1h_retention_days",
             "hot_days")


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as ``FLOPWATCH_*`` variables, for a child process (holds secrets: never log it)."""
    out = {}
    for f in fields(settings):
        val = getattr(settings, f.name)
        if isinstance(val, Secret):
            val = val.get()
        elif isinstance(val, bool):
            val = "true" if val else "false"
        out[ENV_PREFIX + f.name.upper()] = str(val)
    return out
