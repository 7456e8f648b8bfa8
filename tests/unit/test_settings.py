"""Settings (defaults, file, environment, overrides, secrets) and the Kafka client configuration built from them."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from agents.kafka.topics import Topics, aiokafka_config, confluent_config
from agents.settings import Secret, Settings, SettingsError, load_settings, settings_env
from schemas.catalog import CATALOG
from streams.align.aligner import AlignParams
from streams.detect.detectors import DetectParams

KAFKA_PW = "kafka-pw-Zq81"
CH_PW = "clickhouse-pw-Xy42"


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "flopwatch.toml"
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults and parsing ----------------------------------------------------------------------------------------

def test_defaults_without_env_or_file() -> None:
    s = load_settings({})
    assert s.kafka_bootstrap == "127.0.0.1:9092"
    assert s.kafka_security_protocol == "PLAINTEXT"
    assert s.kafka_sasl_mechanism == "PLAIN"
    assert s.topic_prefix == ""
    assert s.partitions == 4
    assert s.group_id == "flopwatch-ingest"
    assert s.clickhouse_backend == "chdb"
    assert s.clickhouse_port == 9000
    assert s.clickhouse_secure is False
    assert s.clickhouse_layout == "current"
    assert s.grid_ms == 1000 and s.lateness_ms == 2000
    assert s.source_idle_s == 15.0 and s.step_idle_s == 0.5 and s.align_params().step_idle_ns == 500_000_000
    assert s.kafka_sasl_password.get() == "" and s.clickhouse_password.get() == ""
    assert s.align_params() == AlignParams(grid_ns=10**9, allowed_lateness_ns=2 * 10**9, idle_ns=15 * 10**9)


def test_the_node_forget_bound_reaches_the_aligner_and_cannot_undercut_the_idle_bound() -> None:
    s = load_settings({"FLOPWATCH_NODE_FORGET_S": "600", "FLOPWATCH_MAX_AGE_S": "86400"})
    assert s.align_params().forget_ns == 600 * 10**9 and s.align_params().remember_ns == 86_400 * 10**9
    with pytest.raises(SettingsError, match=r"^FLOPWATCH_NODE_FORGET_S must be at least FLOPWATCH_SOURCE_IDLE_S "
                                            r"\(FLOPWATCH_NODE_FORGET_S=5, FLOPWATCH_SOURCE_IDLE_S=15\)$"):
        load_settings({"FLOPWATCH_NODE_FORGET_S": "5"})


def test_an_align_error_names_the_settings_not_the_aligner_fields() -> None:
    with pytest.raises(SettingsError, match=r"^FLOPWATCH_GRID_MS must be between 100 ms and 60 s "
                                            r"\(FLOPWATCH_GRID_MS=50\)$"):
        load_settings({"FLOPWATCH_GRID_MS": "50"})
    with pytest.raises(SettingsError, match=r"^FLOPWATCH_LATENESS_MS must be >= 0 \(FLOPWATCH_LATENESS_MS=-1\)$"):
        load_settings({}, lateness_ms=-1)


@pytest.mark.parametrize("old", ["FLOPWATCH_IDLE_SERIES_S", "FLOPWATCH_IDLE_FLUSH_S"])
def test_a_retired_setting_is_an_error_that_names_its_replacement(old: str) -> None:
    with pytest.raises(SettingsError, match=f"{old} is gone.*FLOPWATCH_SOURCE_IDLE_S"):
        load_settings({old: "5"})


def test_a_retired_setting_in_the_config_file_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "fw.toml"
    cfg.write_text("idle_flush_s = 5\n")
    with pytest.raises(SettingsError, match=r"'idle_flush_s' in .*fw.toml is gone"):
        load_settings({}, config_file=cfg)


def test_settings_are_frozen() -> None:
    s = load_settings({})
    with pytest.raises(AttributeError):
        s.partitions = 8  # type: ignore[misc]
    assert s.replace(partitions=8).partitions == 8 and s.partitions == 4


def test_env_parses_int_float_bool_and_literal_fields() -> None:
    s = load_settings({
        "FLOPWATCH_PARTITIONS": "12",
        "FLOPWATCH_SOURCE_IDLE_S": "2.5",
        "FLOPWATCH_CLICKHOUSE_SECURE": "true",
        "FLOPWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "FLOPWATCH_CLICKHOUSE_BACKEND": "native",
        "FLOPWATCH_TOPIC_PREFIX": "staging.",
    })
    assert s.partitions == 12 and type(s.partitions) is int
    assert s.source_idle_s == 2.5 and type(s.source_idle_s) is float
    assert s.clickhouse_secure is True
    assert s.kafka_security_protocol == "SASL_SSL"
    assert s.clickhouse_backend == "native"
    assert s.topic_prefix == "staging."


@pytest.mark.parametrize(("raw", "want"), [("1", True), ("yes", True), ("On", True), (" TRUE ", True),
                                           ("0", False), ("no", False), ("off", False), ("false", False)])
def test_env_bool_spellings(raw: str, want: bool) -> None:
    assert load_settings({"FLOPWATCH_CLICKHOUSE_SECURE": raw}).clickhouse_secure is want


def test_env_ignores_variables_without_the_prefix_or_for_unknown_names() -> None:
    s = load_settings({"PARTITIONS": "9", "KAFKA_BOOTSTRAP": "x:1", "FLOPWATCH_NOT_A_SETTING": "1"})
    assert s.partitions == 4 and s.kafka_bootstrap == "127.0.0.1:9092"


def test_price_book_is_empty_for_the_shipped_example_and_set_by_env_or_file(tmp_path: Path) -> None:
    assert load_settings({}).price_book == ""
    assert load_settings({"FLOPWATCH_PRICE_BOOK": "/etc/flopwatch/prices.toml"}).price_book == "/etc/flopwatch/prices.toml"
    path = write_toml(tmp_path, 'price_book = "mine.toml"\n')
    assert load_settings({}, config_file=path).price_book == "mine.toml"


# --- precedence ----------------------------------------------------------------------------------------------------

def test_file_top_level_keys_override_defaults(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'partitions = 6\ngroup_id = "from-file"\nclickhouse_secure = true\n')
    s = load_settings({}, config_file=path)
    assert (s.partitions, s.group_id, s.clickhouse_secure) == (6, "from-file", True)
    assert s.replication == 1  # untouched keys keep their defaults


def test_file_flopwatch_table_is_read(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[flopwatch]\npartitions = 7\nclickhouse_layout = "legacy"\n')
    s = load_settings({}, config_file=path)
    assert s.partitions == 7 and s.clickhouse_layout == "legacy"


def test_file_named_by_flopwatch_config_env(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "partitions = 5\n")
    assert load_settings({"FLOPWATCH_CONFIG": str(path)}).partitions == 5


def test_precedence_defaults_file_env_overrides(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "partitions = 6\nreplication = 2\nflush_rows = 10\n")
    env = {"FLOPWATCH_REPLICATION": "3", "FLOPWATCH_FLUSH_ROWS": "20"}
    s = load_settings(env, config_file=path, flush_rows=30)
    assert s.max_poll_records == 20000  # default
    assert s.partitions == 6  # file over default
    assert s.replication == 3  # env over file
    assert s.flush_rows == 30  # override over env
    # An override of None means "not given": the lower layers stay.
    assert load_settings(env, config_file=path, flush_rows=None).flush_rows == 20


def test_unknown_key_in_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "partitions = 6\npartitons = 7\n")
    with pytest.raises(SettingsError, match="partitons"):
        load_settings({}, config_file=path)


def test_unknown_key_in_flopwatch_table_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[flopwatch]\ngrid_seconds = 1\n")
    with pytest.raises(SettingsError, match="grid_seconds"):
        load_settings({}, config_file=path)


def test_unknown_override_is_an_error_naming_it() -> None:
    with pytest.raises(SettingsError, match="no_such_option"):
        load_settings({}, no_such_option=1)


def test_unreadable_or_malformed_file_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read config file"):
        load_settings({}, config_file=tmp_path / "missing.toml")
    with pytest.raises(SettingsError, match="cannot read config file"):
        load_settings({}, config_file=write_toml(tmp_path, "partitions = = 3\n"))


# --- bad values ----------------------------------------------------------------------------------------------------

def test_bad_int_names_the_setting_the_value_and_the_type() -> None:
    with pytest.raises(SettingsError) as err:
        load_settings({"FLOPWATCH_PARTITIONS": "four"})
    msg = str(err.value)
    assert "partitions" in msg and "four" in msg and "int" in msg


def test_bad_float_and_bad_bool_are_settings_errors() -> None:
    with pytest.raises(SettingsError, match=r"source_idle_s.*float"):
        load_settings({"FLOPWATCH_SOURCE_IDLE_S": "soon"})
    with pytest.raises(SettingsError, match=r"clickhouse_secure.*bool"):
        load_settings({"FLOPWATCH_CLICKHOUSE_SECURE": "maybe"})


def test_bad_literal_lists_the_allowed_values() -> None:
    with pytest.raises(SettingsError) as err:
        load_settings({"FLOPWATCH_KAFKA_SECURITY_PROTOCOL": "TLS"})
    msg = str(err.value)
    assert "kafka_security_protocol" in msg and "TLS" in msg
    for allowed in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        assert allowed in msg
    with pytest.raises(SettingsError, match=r"clickhouse_backend.*chdb, native"):
        load_settings({}, clickhouse_backend="sqlite")


def test_bad_literal_in_file_is_rejected(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'clickhouse_layout = "ancient"\n')
    with pytest.raises(SettingsError, match="clickhouse_layout"):
        load_settings({}, config_file=path)


@pytest.mark.parametrize("grid_ms", ["50", "99", "60001"])
def test_invalid_grid_fails_at_load_time(grid_ms: str) -> None:
    with pytest.raises(ValueError, match="FLOPWATCH_GRID_MS must be between"):
        load_settings({"FLOPWATCH_GRID_MS": grid_ms})


def test_invalid_grid_is_reported_as_a_settings_error() -> None:
    # The CLI turns SettingsError (only) into a usage error; any other exception is a traceback.
    with pytest.raises(SettingsError, match="FLOPWATCH_GRID_MS must be between"):
        load_settings({"FLOPWATCH_GRID_MS": "50"})


def test_grid_limits_are_inclusive() -> None:
    assert load_settings({"FLOPWATCH_GRID_MS": "100"}).align_params().grid_ns == 100_000_000
    assert load_settings({}, grid_ms=60_000).align_params().grid_ns == 60 * 10**9


# --- secrets -------------------------------------------------------------------------------------------------------

def secret_settings() -> Settings:
    return load_settings({"FLOPWATCH_KAFKA_SASL_PASSWORD": KAFKA_PW, "FLOPWATCH_CLICKHOUSE_PASSWORD": CH_PW,
                          "FLOPWATCH_KAFKA_SASL_USERNAME": "alice"})


def test_secrets_never_appear_in_repr_str_or_describe() -> None:
    s = secret_settings()
    texts = [repr(s), str(s), repr(s.describe()), *s.describe().values(), repr(s.kafka_sasl_password),
             str(s.clickhouse_password), f"{s.clickhouse_password}"]
    for text in texts:
        assert KAFKA_PW not in text and CH_PW not in text
    assert "alice" in repr(s)  # the user name is not a secret: the repr is not simply empty
    assert s.describe()["kafka_sasl_password"] == s.describe()["clickhouse_password"] != repr("")


def test_secrets_are_readable_through_get() -> None:
    s = secret_settings()
    assert isinstance(s.kafka_sasl_password, Secret) and isinstance(s.clickhouse_password, Secret)
    assert s.kafka_sasl_password.get() == KAFKA_PW
    assert s.clickhouse_password.get() == CH_PW
    assert bool(s.clickhouse_password) and not bool(load_settings({}).clickhouse_password)


def test_secret_from_file_and_override(tmp_path: Path) -> None:
    path = write_toml(tmp_path, f'clickhouse_password = "{CH_PW}"\n')
    s = load_settings({}, config_file=path, kafka_sasl_password=Secret(KAFKA_PW))
    assert s.clickhouse_password.get() == CH_PW and s.kafka_sasl_password.get() == KAFKA_PW
    assert CH_PW not in repr(s) and KAFKA_PW not in repr(s)


def test_describe_lists_every_option() -> None:
    d = load_settings({}).describe()
    assert len(d) == len(Settings.__dataclass_fields__)
    assert d["partitions"] == "4" and d["clickhouse_backend"] == "'chdb'"


# --- settings_env round trip -------------------------------------------------------------------------------------

def test_settings_env_round_trips_to_an_equal_configuration() -> None:
    s = load_settings({}, kafka_bootstrap="b1:9092,b2:9092", kafka_security_protocol="SASL_SSL",
                      kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="alice",
                      kafka_sasl_password=KAFKA_PW, clickhouse_password=CH_PW, clickhouse_secure=True,
                      clickhouse_backend="native", clickhouse_layout="legacy", topic_prefix="t1.", partitions=8,
                      source_idle_s=12.5, grid_ms=250, lateness_ms=0, max_age_s=3600.0)
    env = settings_env(s)
    assert all(k.startswith("FLOPWATCH_") for k in env)
    assert all(isinstance(v, str) for v in env.values())
    assert env["FLOPWATCH_CLICKHOUSE_SECURE"] == "true"
    back = load_settings(env)
    assert back.describe() == s.describe()
    assert back.kafka_sasl_password.get() == KAFKA_PW
    assert back.clickhouse_password.get() == CH_PW
    assert back.align_params() == s.align_params()


def test_settings_env_round_trips_the_defaults() -> None:
    s = load_settings({})
    back = load_settings(settings_env(s))
    assert back.describe() == s.describe()
    assert back.kafka_sasl_password.get() == "" and back.clickhouse_password.get() == ""
    assert settings_env(s)["FLOPWATCH_CLICKHOUSE_SECURE"] == "false"


# --- topics and Kafka client configuration -------------------------------------------------------------------------

def test_topic_names_with_prefix() -> None:
    t = Topics("pre.")
    assert len(t.sensors) == 23 == len(CATALOG)
    assert t.sensors == [f"pre.sensors.{s.name}" for s in CATALOG]
    assert t.sensors[0] == "pre.sensors.gpu_util" and t.sensor(4) == "pre.sensors.power"
    assert t.k8s_events == "pre.k8s.events"
    assert t.clock_sync == "pre.clock.sync"
    assert t.outputs == ["pre.flopwatch.frames", "pre.flopwatch.workloads", "pre.flopwatch.triggers",
                         "pre.flopwatch.alerts", "pre.flopwatch.dlq"]
    assert (t.workloads, t.triggers) == ("pre.flopwatch.workloads", "pre.flopwatch.triggers")
    assert (t.frames, t.alerts) == ("pre.flopwatch.frames", "pre.flopwatch.alerts")
    assert t.dlq == "pre.flopwatch.dlq"
    assert t.inputs == [*t.sensors, "pre.k8s.events", "pre.clock.sync"]
    assert t.all == [*t.inputs, *t.outputs]
    assert len(set(t.all)) == 30


def test_topic_names_without_prefix() -> None:
    t = Topics()
    assert "sensors.disk_write" in t.sensors
    assert t.outputs == ["flopwatch.frames", "flopwatch.workloads", "flopwatch.triggers", "flopwatch.alerts",
                         "flopwatch.dlq"]
    assert (t.k8s_events, t.clock_sync) == ("k8s.events", "clock.sync")


def kafka_settings(protocol: str, **extra: str) -> Settings:
    return load_settings({}, kafka_bootstrap="k1:9092", kafka_security_protocol=protocol,
                         kafka_sasl_mechanism="SCRAM-SHA-256", kafka_sasl_username="alice",
                         kafka_sasl_password=KAFKA_PW, **extra)


TLS_FILES = {"kafka_ssl_cafile": "/nonexistent/ca.pem", "kafka_ssl_certfile": "/nonexistent/client.pem",
             "kafka_ssl_keyfile": "/nonexistent/client.key"}


@pytest.mark.parametrize(("protocol", "sasl", "tls"), [("PLAINTEXT", False, False), ("SSL", False, True),
                                                       ("SASL_PLAINTEXT", True, False), ("SASL_SSL", True, True)])
def test_confluent_config_adds_sasl_and_tls_only_for_their_protocols(protocol: str, sasl: bool, tls: bool) -> None:
    conf = confluent_config(kafka_settings(protocol, **TLS_FILES))
    assert conf["bootstrap.servers"] == "k1:9092"
    assert conf["security.protocol"] == protocol
    sasl_keys = {"sasl.mechanism", "sasl.username", "sasl.password"}
    tls_keys = {"ssl.ca.location", "ssl.certificate.location", "ssl.key.location"}
    if sasl:
        assert conf["sasl.mechanism"] == "SCRAM-SHA-256"
        assert conf["sasl.username"] == "alice"
        assert conf["sasl.password"] == KAFKA_PW
    else:
        assert not sasl_keys & conf.keys()
    if tls:
        assert conf["ssl.ca.location"] == "/nonexistent/ca.pem"
        assert conf["ssl.certificate.location"] == "/nonexistent/client.pem"
        assert conf["ssl.key.location"] == "/nonexistent/client.key"
    else:
        assert not tls_keys & conf.keys()


def test_confluent_config_omits_empty_tls_files() -> None:
    conf = confluent_config(kafka_settings("SSL", kafka_ssl_cafile="/etc/ca.pem"))
    assert conf["ssl.ca.location"] == "/etc/ca.pem"
    assert "ssl.certificate.location" not in conf and "ssl.key.location" not in conf


@pytest.mark.parametrize(("protocol", "sasl"), [("PLAINTEXT", False), ("SASL_PLAINTEXT", True)])
def test_aiokafka_config_without_ssl_ignores_tls_files(protocol: str, sasl: bool) -> None:
    # The TLS paths do not exist: reading them here would raise.
    conf = aiokafka_config(kafka_settings(protocol, **TLS_FILES))
    assert conf["bootstrap_servers"] == "k1:9092" and conf["security_protocol"] == protocol
    assert "ssl_context" not in conf
    if sasl:
        assert conf["sasl_mechanism"] == "SCRAM-SHA-256"
        assert conf["sasl_plain_username"] == "alice"
        assert conf["sasl_plain_password"] == KAFKA_PW
    else:
        assert not {"sasl_mechanism", "sasl_plain_username", "sasl_plain_password"} & conf.keys()


@pytest.mark.parametrize(("protocol", "sasl"), [("SSL", False), ("SASL_SSL", True)])
def test_aiokafka_config_with_ssl_builds_a_verifying_context(protocol: str, sasl: bool) -> None:
    conf = aiokafka_config(kafka_settings(protocol))
    ctx = conf["ssl_context"]
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert conf["security_protocol"] == protocol
    assert ("sasl_plain_password" in conf) is sasl
    if sasl:
        assert conf["sasl_plain_password"] == KAFKA_PW


def test_aiokafka_config_with_ssl_uses_the_tls_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        aiokafka_config(kafka_settings("SSL", kafka_ssl_cafile=str(tmp_path / "missing-ca.pem")))
    junk = tmp_path / "client.pem"
    junk.write_text("not a certificate\n", encoding="utf-8")
    with pytest.raises(ssl.SSLError):
        aiokafka_config(kafka_settings("SASL_SSL", kafka_ssl_certfile=str(junk)))
    # The same files are not touched without SSL.
    assert "ssl_context" not in aiokafka_config(kafka_settings("SASL_PLAINTEXT", kafka_ssl_certfile=str(junk)))


def test_detection_settings_reach_the_detectors_and_are_checked_at_load() -> None:
    s = load_settings({"FLOPWATCH_DRIFT_DROP": "0.15", "FLOPWATCH_DRIFT_HOLD_S": "5", "FLOPWATCH_SPIKE_UTIL_PCT": "90"})
    p = s.detect_params()
    assert (p.drift.drop, p.drift.floor, p.drift.hold_ns) == (0.15, 0.10, 5_000_000_000)
    assert p.spike_thresholds["gpu_util"] == 90.0
    with pytest.raises(SettingsError, match="drift/spike settings"):
        load_settings({"FLOPWATCH_DRIFT_DROP": "0.08"})  # below the never-alert floor


def test_loading_the_settings_imports_neither_river_nor_scipy() -> None:
    # Every CLI command loads them; River's drift module pulls in all of scipy.stats, ~0.8 s of a 1.4 s
    # `flopwatch --help`. The detectors import it when the first one is built.
    code = ("import sys; from agents.settings import load_settings; load_settings({}).detect_params(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'river', 'scipy'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "[]"


def test_the_defaults_are_those_of_the_pure_parameters() -> None:
    # Each default is written once, in streams/: the settings derive theirs from it.
    s = Settings()
    assert s.align_params() == AlignParams()
    assert s.detect_params() == DetectParams()


@pytest.mark.parametrize("value", ["5", "301"])
def test_a_session_timeout_the_broker_would_refuse_is_refused_at_start(value: str) -> None:
    with pytest.raises(SettingsError, match=r"kafka_session_timeout_s=.*6-300"):
        load_settings({"FLOPWATCH_KAFKA_SESSION_TIMEOUT_S": value})


def test_the_session_timeout_reaches_the_faust_app() -> None:
    from agents.app import create_app

    settings = load_settings({"FLOPWATCH_KAFKA_SESSION_TIMEOUT_S": "12.5"}, web_enabled=False)
    assert create_app(settings, detect=False).conf.broker_session_timeout == 12.5


def test_the_faust_data_directory_lies_beside_chdbs_not_in_the_working_directory(tmp_path: Path) -> None:
    from agents.app import create_app

    app = create_app(load_settings({}, web_enabled=False, group_id="gx", chdb_path=str(tmp_path / "db" / "chdb")),
                     detect=False)
    assert Path(app.conf.datadir) == tmp_path / "db" / "faust" / "gx-app"
    app.conf.datadir.mkdir(exist_ok=True)  # what Faust does as it starts: only the last level
