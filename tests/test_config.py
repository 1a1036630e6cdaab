"""Configuration: where it is read from, what it may contain, and secrets (no Spark needed).

conftest's autouse fixture runs every test in an empty working directory with
``SPARKJET_CONFIG`` and the plugin switches unset.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import sparkjet
from sparkjet.core.config import DEFAULT_STORE_URL, Config, EngineSettings, load_config
from sparkjet.errors import ConfigError

SECRET = "hunter2-Zq9-very-secret"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path.resolve()


# --- where the configuration comes from -----------------------------------------


def test_defaults_without_any_file() -> None:
    config = load_config()

    assert config.source is None
    assert config.spark_master == "local[*]"
    assert config.spark_remote is None
    assert config.spark_app_name == "sparkjet"
    assert config.spark_conf == {}
    assert config.store_url == DEFAULT_STORE_URL == "./.sparkjet"
    assert config.snapshots_backend == "local"
    assert config.snapshots_signing_key is None
    assert config.plugins_disable == []
    assert config.plugin_options == {}


def test_connect_works_without_a_configuration_file() -> None:
    client = sparkjet.connect()  # no Spark yet: it starts with the first job

    assert client.config.source is None
    assert client.store.url == "./.sparkjet"
    assert {"list", "map", "logger"} <= set(client.plugins.plugins)


def test_sparkjet_toml_in_the_working_directory() -> None:
    path = write(
        Path("sparkjet.toml"),
        """
[spark]
master = "local[3]"
app_name = "from-file"

[store]
url = "/data/jet"
options = { anon = true }

[snapshots]
backend = "memory"
url = "memory://snaps"
options = { region = "eu" }
""",
    )

    config = load_config()

    assert config.source == str(path)
    assert config.spark_master == "local[3]"
    assert config.spark_app_name == "from-file"
    assert config.store_url == "/data/jet"
    assert config.store_options == {"anon": True}
    assert config.snapshots_backend == "memory"
    assert config.snapshots_url == "memory://snaps"
    assert config.snapshots_options == {"region": "eu"}


def test_tool_sparkjet_in_pyproject() -> None:
    write(
        Path("pyproject.toml"),
        """
[project]
name = "someone-elses-project"

[tool.sparkjet.spark]
master = "local[1]"

[tool.sparkjet.store]
url = "/from/pyproject"
""",
    )

    config = load_config()

    assert config.source is not None
    assert config.source.endswith("pyproject.toml [tool.sparkjet]")
    assert config.spark_master == "local[1]"
    assert config.store_url == "/from/pyproject"


def test_pyproject_without_tool_sparkjet_gives_defaults() -> None:
    write(Path("pyproject.toml"), '[project]\nname = "x"\n\n[tool.ruff]\nline-length = 99\n')

    config = load_config()

    assert config.source is None
    assert config.store_url == DEFAULT_STORE_URL


def test_tool_sparkjet_that_is_not_a_table_is_an_error() -> None:
    write(Path("pyproject.toml"), "[tool]\nsparkjet = 3\n")

    with pytest.raises(ConfigError) as info:
        load_config()

    message = str(info.value)
    assert "pyproject.toml [tool.sparkjet]" in message
    assert "expected a table" in message


def test_sparkjet_toml_wins_over_pyproject() -> None:
    write(Path("pyproject.toml"), '[tool.sparkjet.store]\nurl = "/from/pyproject"\n')
    write(Path("sparkjet.toml"), '[store]\nurl = "/from/sparkjet-toml"\n')

    assert load_config().store_url == "/from/sparkjet-toml"


def test_sparkjet_config_names_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write(Path("sparkjet.toml"), '[store]\nurl = "/from/cwd"\n')
    named = write(tmp_path / "elsewhere.toml", '[store]\nurl = "/from/named"\n')
    monkeypatch.setenv("SPARKJET_CONFIG", str(named))

    config = load_config()

    assert config.store_url == "/from/named"
    assert config.source == str(named)


def test_sparkjet_config_naming_a_pyproject_reads_its_tool_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "proj").mkdir()
    named = write(tmp_path / "proj" / "pyproject.toml", '[tool.sparkjet.store]\nurl = "/p"\n')
    monkeypatch.setenv("SPARKJET_CONFIG", str(named))

    assert load_config().store_url == "/p"


def test_sparkjet_config_naming_a_missing_file_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.toml"
    monkeypatch.setenv("SPARKJET_CONFIG", str(missing))

    with pytest.raises(ConfigError) as info:
        load_config()

    assert "SPARKJET_CONFIG" in str(info.value)
    assert str(missing) in str(info.value)


def test_connect_with_an_explicit_file(tmp_path: Path) -> None:
    named = write(tmp_path / "explicit.toml", '[store]\nurl = "/explicit"\n')

    client = sparkjet.connect(named)

    assert client.config.store_url == "/explicit"
    assert client.config.source == str(named)


def test_connect_with_a_missing_explicit_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"

    with pytest.raises(ConfigError, match=r"absent\.toml"):
        sparkjet.connect(missing)


def test_keyword_overrides_beat_the_file_key_by_key() -> None:
    write(
        Path("sparkjet.toml"),
        """
[spark]
master = "local[3]"
app_name = "from-file"

[spark.conf]
"spark.a" = "file"
"spark.b" = "file"

[store]
url = "/from/file"
""",
    )

    config = load_config(
        {"spark": {"master": "local[1]", "conf": {"spark.b": "override"}},
         "store": {"url": "/from/override"}}
    )

    assert config.spark_master == "local[1]"
    assert config.spark_app_name == "from-file"  # not overridden: kept
    assert config.spark_conf == {"spark.a": "file", "spark.b": "override"}
    assert config.store_url == "/from/override"


def test_connect_passes_overrides() -> None:
    write(Path("sparkjet.toml"), '[store]\nurl = "/from/file"\n')

    client = sparkjet.connect(store={"url": "/from/connect"})

    assert client.config.store_url == "/from/connect"
    assert client.store.url == "/from/connect"


# --- validation -------------------------------------------------------------------


def test_unknown_section_names_file_section_and_expected() -> None:
    path = write(Path("sparkjet.toml"), '[sprak]\nmaster = "local"\n')

    with pytest.raises(ConfigError) as info:
        load_config()

    message = str(info.value)
    assert str(path) in message
    assert "[sprak]" in message
    assert "[spark]" in message  # what was expected
    assert "[store]" in message


def test_unknown_key_names_file_key_and_expected() -> None:
    path = write(Path("sparkjet.toml"), '[store]\nuri = "/x"\n')

    with pytest.raises(ConfigError) as info:
        load_config()

    message = str(info.value)
    assert str(path) in message
    assert "'uri'" in message
    assert "[store]" in message
    assert "url" in message
    assert "options" in message


@pytest.mark.parametrize(
    ("toml", "key", "expected", "got"),
    [
        ("[spark]\nmaster = 4\n", "[spark] master", "Spark master URL", "4 (int)"),
        ("[store]\nurl = true\n", "[store] url", "fsspec URL", "a bool"),
        ('[spark]\nconf = "x"\n', "[spark] conf", "a table of Spark settings", "'x' (str)"),
        ('[snapshots]\nsigning_key = ["a"]\n', "[snapshots] signing_key", "a string", "['a']"),
        ('[plugins]\ndisable = "logger"\n', "[plugins] disable", "a list of plugin names",
         "'logger' (str)"),
        ("[plugins]\ndisable = [1]\n", "[plugins] disable", "a list of plugin names", "1 (int)"),
        ('[spark.conf]\n"spark.x" = [1, 2]\n', "[spark.conf] spark.x",
         "a string, number or bool", "[1, 2] (list)"),
        ("[spark]\nmaster = { a = 1 }\n", "[spark] master", "Spark master URL", "a table"),
        ('store = "x"\n', "[store]", "must be a table", "'x' (str)"),
    ],
)
def test_wrong_type_names_file_key_and_expected(
    toml: str, key: str, expected: str, got: str
) -> None:
    path = write(Path("sparkjet.toml"), toml)

    with pytest.raises(ConfigError) as info:
        load_config()

    message = str(info.value)
    assert str(path) in message
    assert key in message
    assert expected in message
    assert got in message


def test_wrong_type_in_overrides_names_connect_arguments() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"spark": {"master": 1}})

    assert "connect() arguments" in str(info.value)
    assert "[spark] master" in str(info.value)


def test_unknown_section_in_overrides() -> None:
    with pytest.raises(ConfigError, match=r"connect\(\) arguments: unknown section \[strore\]"):
        sparkjet.connect(strore={"url": "/x"})


def test_override_that_is_not_a_table_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        sparkjet.connect(spark="local[2]")  # type: ignore[arg-type]

    assert "connect() arguments" in str(info.value)
    assert "spark=" in str(info.value)


def test_invalid_toml_names_the_file() -> None:
    path = write(Path("sparkjet.toml"), '[spark]\nmaster = "local[2]\n')

    with pytest.raises(ConfigError) as info:
        load_config()

    assert str(path) in str(info.value)
    assert "invalid TOML" in str(info.value)
    assert info.value.__cause__ is not None


def test_invalid_toml_in_pyproject_names_the_file() -> None:
    write(Path("pyproject.toml"), "[tool.sparkjet\n")

    with pytest.raises(ConfigError, match=r"pyproject\.toml: invalid TOML"):
        load_config()


# --- environment references and secrets ---------------------------------------------


def test_env_references_are_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SJ_TEST_BUCKET", "my-bucket")
    monkeypatch.setenv("SJ_TEST_KEY", SECRET)
    write(
        Path("sparkjet.toml"),
        """
[store]
url = "s3://${env:SJ_TEST_BUCKET}/jet"
options = { secret = "${env:SJ_TEST_KEY}" }

[snapshots]
signing_key = "${env:SJ_TEST_KEY}"
""",
    )

    config = load_config()

    assert config.store_url == "s3://my-bucket/jet"
    assert config.store_options == {"secret": SECRET}
    assert config.snapshots_signing_key == SECRET


def test_missing_env_variable_names_the_key_and_variable() -> None:
    path = write(Path("sparkjet.toml"), '[snapshots]\nsigning_key = "${env:SJ_TEST_UNSET}"\n')

    with pytest.raises(ConfigError) as info:
        load_config()

    message = str(info.value)
    assert str(path) in message
    assert "[snapshots] signing_key" in message
    assert "SJ_TEST_UNSET" in message


def test_missing_env_variable_in_a_nested_table_names_the_nested_key() -> None:
    write(Path("sparkjet.toml"), '[plugins.example]\ntoken = "${env:SJ_TEST_UNSET}"\n')

    with pytest.raises(ConfigError) as info:
        load_config()

    assert "[plugins] example.token" in str(info.value)
    assert "SJ_TEST_UNSET" in str(info.value)


def test_secrets_are_never_shown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SJ_TEST_SECRET", SECRET)
    store = tmp_path / "store"
    write(
        Path("sparkjet.toml"),
        f"""
[store]
url = "{store.as_posix()}/${{env:SJ_TEST_SECRET}}"

[spark.conf]
"spark.hadoop.fs.s3a.secret.key" = "${{env:SJ_TEST_SECRET}}"

[snapshots]
signing_key = "${{env:SJ_TEST_SECRET}}"

[plugins.example]
token = "${{env:SJ_TEST_SECRET}}"
""",
    )

    client = sparkjet.connect()
    config = client.config

    # The values are there to be used ...
    assert config.store_url.endswith(SECRET)
    assert config.snapshots_signing_key == SECRET
    assert config.plugin_options["example"]["token"] == SECRET
    assert config.spark_conf["spark.hadoop.fs.s3a.secret.key"] == SECRET
    # ... but never shown.
    assert SECRET not in repr(config)
    assert SECRET not in str(config)
    assert SECRET not in repr(client)
    assert "***" in repr(client)
    assert SECRET not in config.redact(f"store {config.store_url} failed; conf {config.spark_conf}")
    assert config.redact(f"key={SECRET}!") == "key=***!"


def test_secrets_from_overrides_are_redacted_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SJ_TEST_SECRET", SECRET)

    config = load_config({"store": {"url": "/jet/${env:SJ_TEST_SECRET}"}})

    assert config.store_url == f"/jet/{SECRET}"
    assert SECRET not in repr(config)


def test_redact_without_secrets_changes_nothing() -> None:
    assert Config().redact("nothing to hide") == "nothing to hide"


# --- plugin tables and Spark settings --------------------------------------------------


def test_plugin_tables_reach_plugin_options() -> None:
    write(
        Path("sparkjet.toml"),
        """
[plugins]
disable = ["logger", "map"]

[plugins.example]
path = "/out"
retries = 3

[plugins.other]
flag = true
""",
    )

    config = load_config({"plugins": {"example": {"retries": 5}}})

    assert config.plugins_disable == ["logger", "map"]
    assert config.plugin_options == {
        "example": {"path": "/out", "retries": 5},
        "other": {"flag": True},
    }


def test_plugins_disable_reaches_the_plugin_host() -> None:
    write(Path("sparkjet.toml"), '[plugins]\ndisable = ["map"]\n')

    client = sparkjet.connect()

    assert "map" not in client.plugins.plugins
    assert "list" in client.plugins.plugins


def test_spark_conf_values_become_strings() -> None:
    write(
        Path("sparkjet.toml"),
        """
[spark.conf]
"spark.ui.enabled" = false
"spark.sql.adaptive.enabled" = true
"spark.sql.shuffle.partitions" = 4
"spark.memory.fraction" = 0.5
"spark.app.label" = "x"
""",
    )

    conf = load_config().spark_conf

    assert conf == {
        "spark.ui.enabled": "false",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.shuffle.partitions": "4",
        "spark.memory.fraction": "0.5",
        "spark.app.label": "x",
    }
    assert all(isinstance(value, str) for value in conf.values())


def test_spark_conf_with_unquoted_dotted_keys() -> None:
    # TOML reads an unquoted `spark.ui.enabled` as nested tables; Spark wants the dotted key.
    write(
        Path("sparkjet.toml"),
        """
[spark.conf]
spark.ui.enabled = false
spark.sql.shuffle.partitions = 2
""",
    )

    assert load_config().spark_conf == {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
    }


def test_spark_conf_booleans_from_overrides() -> None:
    config = load_config({"spark": {"conf": {"spark.ui.enabled": False, "spark.x": True}}})

    assert config.spark_conf == {"spark.ui.enabled": "false", "spark.x": "true"}


# --- [engine]: where a micro-batch runs -------------------------------------------


def test_engine_defaults() -> None:
    engine = load_config().engine

    assert engine == EngineSettings()
    assert engine.adaptive is True
    assert engine.local_max_items == 5000
    assert engine.local_max_bytes == 4 * 1024 * 1024
    assert engine.driver_state_bytes == 256 * 1024 * 1024
    assert engine.cold_state_bytes == 32 * 1024 * 1024
    with pytest.raises(AttributeError):
        engine.adaptive = False  # type: ignore[misc]  # frozen: one client's settings


def test_engine_table_and_overrides_key_by_key() -> None:
    write(
        Path("sparkjet.toml"),
        """
[engine]
adaptive = false
local_max_items = 20_000
cold_state_bytes = 0
""",
    )

    from_file = load_config().engine
    assert from_file == EngineSettings(
        adaptive=False, local_max_items=20_000, cold_state_bytes=0)

    config = load_config({"engine": {"adaptive": True, "local_max_bytes": 1024}})
    assert config.engine == EngineSettings(
        adaptive=True, local_max_items=20_000, local_max_bytes=1024, cold_state_bytes=0)

    client = sparkjet.connect(engine={"driver_state_bytes": 7})
    assert client.config.engine.driver_state_bytes == 7
    assert client.config.engine.local_max_items == 20_000  # the file's, kept


@pytest.mark.parametrize(
    ("toml", "key", "expected", "got"),
    [
        ('[engine]\nadaptive = "yes"\n', "[engine] adaptive", "true or false", "'yes' (str)"),
        ("[engine]\nadaptive = 1\n", "[engine] adaptive", "true or false", "1 (int)"),
        ("[engine]\nlocal_max_items = -1\n", "[engine] local_max_items",
         "a whole number of items, 0 or more", "-1 (int)"),
        ("[engine]\nlocal_max_items = 2.5\n", "[engine] local_max_items",
         "a whole number of items, 0 or more", "2.5 (float)"),
        ("[engine]\nlocal_max_items = true\n", "[engine] local_max_items",
         "a whole number of items, 0 or more", "a bool"),
        ('[engine]\nlocal_max_bytes = "4MiB"\n', "[engine] local_max_bytes",
         "a whole number of bytes, 0 or more", "'4MiB' (str)"),
        ("[engine]\ndriver_state_bytes = -5\n", "[engine] driver_state_bytes",
         "a whole number of bytes, 0 or more", "-5 (int)"),
        ("[engine]\ncold_state_bytes = [1]\n", "[engine] cold_state_bytes",
         "a whole number of bytes, 0 or more", "[1] (list)"),
        ('engine = "local"\n', "[engine]", "must be a table", "'local' (str)"),
    ],
)
def test_bad_engine_values_name_file_key_and_expected(
    toml: str, key: str, expected: str, got: str
) -> None:
    path = write(Path("sparkjet.toml"), toml)

    with pytest.raises(ConfigError) as info:
        load_config()

    message = str(info.value)
    assert message.startswith(f"{path}: {key}"), message
    assert expected in message
    assert got in message


def test_unknown_engine_key_is_refused_naming_the_known_ones() -> None:
    path = write(Path("sparkjet.toml"), "[engine]\nlocal_max_item = 10\n")

    with pytest.raises(ConfigError) as info:
        load_config()

    assert str(info.value) == (
        f"{path}: unknown key 'local_max_item' in [engine] (expected one of: adaptive, "
        "cold_state_bytes, driver_only, driver_state_bytes, idle_poll_max_seconds, "
        "join_table_max_bytes, local_max_bytes, local_max_items, stream_poll_seconds)"
    )


def test_bad_engine_value_in_connect_arguments() -> None:
    with pytest.raises(ConfigError, match=r"^connect\(\) arguments: \[engine\] "
                       r"local_max_bytes: expected a whole number of bytes, 0 or more, got -1"):
        sparkjet.connect(engine={"local_max_bytes": -1})


def test_driver_only_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"^connect\(\) arguments: \[engine\] "
                       r"driver_only: expected true or false, got 'yes' \(str\)"):
        sparkjet.connect(engine={"driver_only": "yes"})


def test_a_driver_only_client_runs_batch_and_streaming_jobs_and_never_starts_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sparkjet.core.engine.spark import session
    from sparkjet.errors import JobCancelledError
    from sparkjet.pipeline import Pipeline, StreamSource

    def no_spark(*args: object, **kwargs: object) -> None:
        raise AssertionError("a driver_only client started Spark")

    monkeypatch.setattr(session, "get_session", no_spark)
    client = sparkjet.connect(store={"url": str(tmp_path / "store")},
                              engine={"driver_only": True})
    assert client.runs_on_spark is False
    assert sparkjet.connect(store={"url": str(tmp_path / "store")}).runs_on_spark is True
    batch = Pipeline.create()
    (batch.read_from(Pipeline.from_list("numbers", range(100))).map(lambda n: n * 2)
     .write_to(Pipeline.to_list("doubled")))
    client.get_jet().submit(batch).join(timeout=60)
    assert sorted(client.get_list("doubled").get_all()) == [n * 2 for n in range(100)]
    client.get_stream("events", partitions=2).publish_all(list(range(10)))
    streaming = Pipeline.create()
    streaming.read_from(StreamSource("events")).write_to(Pipeline.to_list("seen"))
    job = client.get_jet().submit(streaming)
    deadline = time.monotonic() + 60
    while client.get_list("seen").size() < 10:
        assert time.monotonic() < deadline, "the streaming job read nothing"
        time.sleep(0.01)
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=60)
    assert sorted(client.get_list("seen").get_all()) == list(range(10))
    assert job.get_metrics()["localBatches"] >= 1


# --- [engine]: how an idle streaming job polls S3 and GCS ---------------------------------


def test_poll_settings_default_and_reach_the_store() -> None:
    from sparkjet.core.store.stream_log import PollSettings

    engine = load_config().engine
    assert (engine.stream_poll_seconds, engine.idle_poll_max_seconds) == (0.05, 5.0)
    write(Path("sparkjet.toml"), "[engine]\nstream_poll_seconds = 0.1\n"
          "idle_poll_max_seconds = 30\n")
    client = sparkjet.connect()
    assert client.config.engine.idle_poll_max_seconds == 30
    assert client.store.poll == PollSettings(first=0.1, most=30)


@pytest.mark.parametrize("key", ["stream_poll_seconds", "idle_poll_max_seconds"])
@pytest.mark.parametrize("value", ["0", "-1", '"5s"', "true"])
def test_a_bad_poll_setting_is_refused_naming_it(key: str, value: str) -> None:
    path = write(Path("sparkjet.toml"), f"[engine]\n{key} = {value}\n")

    with pytest.raises(ConfigError) as info:
        load_config()

    assert str(info.value).startswith(
        f"{path}: [engine] {key}: expected a number of seconds, more than 0, got ")


def test_a_first_poll_longer_than_the_most_is_refused_naming_both() -> None:
    path = write(Path("sparkjet.toml"), "[engine]\nstream_poll_seconds = 10\n")

    with pytest.raises(ConfigError) as info:
        load_config()

    assert str(info.value) == (
        f"{path}: [engine] stream_poll_seconds (10) is more than idle_poll_max_seconds (5): "
        "an idle job's first look cannot wait longer than the most it backs off to")
