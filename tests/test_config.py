"""Configuration precedence, validation messages, and the documented example file."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest
import yaml

from otel_gpu import cli, config
from otel_gpu.config import (
    OPTIONS,
    Config,
    ConfigError,
    Option,
    load,
    parse_duration,
    parse_listen,
)
from otel_gpu.errors import SetupError

ROOT = Path(__file__).resolve().parents[1]


def test_defaults():
    cfg = load({}, environ={})
    assert cfg.listen == ("0.0.0.0", 9400)
    assert cfg.interval == 10.0
    assert cfg.simulate is None
    assert cfg.log_level == "info"
    assert cfg.log_format == "text"


def test_file_then_env_then_flags(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("interval: 30s\nlisten: 127.0.0.1:9500\nlog_level: debug\n")
    env = {"OTEL_GPU_INTERVAL": "5", "OTEL_GPU_LOG_FORMAT": "json"}
    cfg = load({"interval": "250ms"}, environ=env, config_file=str(path))
    assert cfg.interval == 0.25  # flag beats env beats file
    assert cfg.listen == ("127.0.0.1", 9500)  # file beats default
    assert cfg.log_level == "debug"
    assert cfg.log_format == "json"  # env beats default
    assert load({}, environ=env, config_file=str(path)).interval == 5.0


def test_config_file_from_env(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("simulate: t4\n")
    assert load({}, environ={"OTEL_GPU_CONFIG": str(path)}).simulate == "t4"


def test_node_name_falls_back_to_node_name_variable():
    assert load({}, environ={"NODE_NAME": "gpu-node-7"}).node_name == "gpu-node-7"
    env = {"NODE_NAME": "a", "OTEL_GPU_NODE_NAME": "b"}
    assert load({}, environ=env).node_name == "b"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10", 10.0), (2.5, 2.5), ("500ms", 0.5), ("10s", 10.0), ("1m", 60.0), ("1h", 3600.0)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "abc", "-1", "0", "10 parsecs", True])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_listen_forms():
    assert parse_listen(":9400") == ("0.0.0.0", 9400)
    assert parse_listen("[::]:9401") == ("::", 9401)
    for bad in ("9400", "host:", "host:99999", "host:http"):
        with pytest.raises(ValueError):
            parse_listen(bad)


@pytest.mark.parametrize(
    ("flags", "env", "file_text", "expected"),
    [
        ({"interval": "soon"}, {}, None,
         r"^interval \(from flag --interval\): expected a duration"),
        ({}, {"OTEL_GPU_LOG_LEVEL": "loud"}, None,
         r"^log_level \(from environment variable OTEL_GPU_LOG_LEVEL\): expected one of"),
        ({}, {}, "listen: nowhere\n", r"^listen \(from config file .*\): expected HOST:PORT"),
        ({}, {}, "intervall: 5\n", r"^config file .*: unknown key 'intervall'; known keys:"),
        ({}, {}, "interval: [1, 2\n", r"^config file .*: .* at line \d+"),
        ({}, {}, "- a list\n", r"^config file .*: expected a mapping"),
    ],
)
def test_errors_are_one_line_and_name_the_key(tmp_path, flags, env, file_text, expected):
    path = None
    if file_text is not None:
        path = tmp_path / "c.yaml"
        path.write_text(file_text)
    with pytest.raises(ConfigError) as info:
        load(flags, environ=env, config_file=str(path) if path else None)
    message = str(info.value)
    assert "\n" not in message
    assert re.search(expected, message), message


def test_missing_config_file_is_named(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope.yaml: cannot read it"):
        load({}, environ={}, config_file=str(missing))


def test_example_file_documents_every_option_with_its_default():
    path = ROOT / "config" / "otel-gpu.yaml"
    doc = yaml.safe_load(path.read_text())
    text = path.read_text()
    assert set(doc) == {o.key for o in OPTIONS}
    for option in OPTIONS:
        parsed_default = option.parse(option.default) if option.default is not None else None
        parsed_file = option.parse(doc[option.key]) if doc[option.key] is not None else None
        assert parsed_file == parsed_default, option.key
        assert option.env in text and option.flag in text, option.key
    # and the file itself loads as a configuration
    assert load({}, environ={}, config_file=str(path)) == load({}, environ={})


def test_config_has_one_field_per_option_typed_by_its_row():
    fields = dataclasses.fields(Config)
    assert [f.name for f in fields] == [o.key for o in OPTIONS]
    assert [f.type for f in fields] == [o.type for o in OPTIONS]
    assert Config.__module__ == "otel_gpu.config" and Config.__doc__
    with pytest.raises(dataclasses.FrozenInstanceError):
        load({}, environ={}).interval = 1.0  # type: ignore[misc]


def _is(value, kind) -> bool:
    if isinstance(kind, types.UnionType):
        return any(_is(value, arm) for arm in typing.get_args(kind))
    if kind is type(None):
        return value is None
    return isinstance(value, typing.get_origin(kind) or kind)


def test_every_default_parses_to_its_rows_type():
    cfg = load({}, environ={})
    for option in OPTIONS:
        assert _is(getattr(cfg, option.key), option.type), option.key
        assert option.metavar and option.help, option.key


def test_a_new_row_is_a_flag_a_variable_a_file_key_and_a_field(monkeypatch, tmp_path, capsys):
    toy = Option("toy_limit", int, "3", int, "COUNT", "a toy setting for this test", short="-T")
    options = (*OPTIONS, toy)
    monkeypatch.setattr(config, "OPTIONS", options)
    monkeypatch.setattr(config, "Config", config.config_class(options))
    monkeypatch.setattr(cli, "OPTIONS", options)
    assert load({}, environ={}).toy_limit == 3
    assert load({}, environ={"OTEL_GPU_TOY_LIMIT": "5"}).toy_limit == 5
    path = tmp_path / "c.yaml"
    path.write_text("toy_limit: 6\n")
    assert load({}, environ={}, config_file=str(path)).toy_limit == 6
    for argv in (["--toy-limit", "7"], ["serve", "-T", "7"]):
        assert cli._config(cli.build_parser().parse_args(argv)).toy_limit == 7
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "-T COUNT, --toy-limit COUNT a toy setting for this test" in help_text
    assert "$OTEL_GPU_TOY_LIMIT; default 3" in help_text
    with pytest.raises(ConfigError, match=r"^toy_limit \(from flag --toy-limit\): "):
        load({"toy_limit": "many"}, environ={})


def test_config_error_is_a_setup_error():
    assert issubclass(ConfigError, SetupError) and issubclass(SetupError, ValueError)
