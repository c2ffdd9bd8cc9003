"""Configuration precedence, validation messages, and the documented example file."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_gpu import cli, config
from otel_gpu.config import (
    OPTIONS,
    Config,
    ConfigError,
    Option,
    docs,
    load,
    options_of,
    parse_duration,
    parse_listen,
)
from otel_gpu.errors import SetupError
from otel_gpu.export.http.webconfig import load_web_config
from tests.support.configs import ToyConfig, help_invocation

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
        ({}, {}, "intervall: 5\n",
         r"^config file .*: unknown key 'intervall' \(did you mean interval\?\); known keys:"),
        ({}, {}, "interval: [1, 2\n", r"^config file .*: .* at line \d+"),
        ({}, {}, "- a list\n",
         r"^config file [^:]*: expected a mapping of settings at the top level$"),
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
    hints = typing.get_type_hints(Config)
    assert [f.name for f in fields] == [o.key for o in OPTIONS]
    assert [hints[f.name] for f in fields] == [o.type for o in OPTIONS]
    assert [f.default for f in fields] == [o.value for o in OPTIONS]  # the row's default, parsed
    assert Config() == load({}, environ={})
    assert Config.__module__ == "otel_gpu.config.settings" and Config.__doc__
    assert not hasattr(config, "config_class")  # no make_dataclass: a checker sees the fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        load({}, environ={}).interval = 1.0  # type: ignore[misc]


def _is(value, kind) -> bool:
    if isinstance(kind, types.UnionType):
        return any(_is(value, arm) for arm in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if typing.get_origin(kind) is typing.Literal:
        return value in typing.get_args(kind)
    return isinstance(value, typing.get_origin(kind) or kind)


def test_every_default_parses_to_its_rows_type():
    cfg = load({}, environ={})
    for option in OPTIONS:
        assert _is(getattr(cfg, option.key), option.type), option.key
        assert option.metavar and option.help, option.key


def test_a_new_field_is_a_flag_a_variable_a_file_key_and_a_row(monkeypatch, tmp_path, capsys):
    options = options_of(ToyConfig)
    assert options[:-1] == OPTIONS and options[-1].key == "toy_limit"
    assert options[-1].type is int and options[-1].serve_only
    monkeypatch.setattr(config.settings, "OPTIONS", options)
    monkeypatch.setattr(config.settings, "Config", ToyConfig)
    monkeypatch.setattr(cli, "OPTIONS", options)
    assert load({}, environ={}).toy_limit == 3
    assert load({}, environ={"OTEL_GPU_TOY_LIMIT": "5"}).toy_limit == 5
    path = tmp_path / "c.yaml"
    path.write_text("toy_limit: 6\n")
    assert load({}, environ={}, config_file=str(path)).toy_limit == 6
    for argv in (["--toy-limit", "7"], ["serve", "-T", "7"], ["check", "-T", "7"]):
        assert cli._config(cli.build_parser().parse_args(argv)).toy_limit == 7
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert help_invocation(("-T", "--toy-limit"), "COUNT") + " a toy setting for this test" \
        in help_text
    assert "$OTEL_GPU_TOY_LIMIT; default 3" in help_text
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["check", "--help"])
    assert "--toy-limit" not in capsys.readouterr().out  # serve only
    with pytest.raises(ConfigError, match=r"^toy_limit \(from flag -T/--toy-limit\): "):
        load({"toy_limit": "many"}, environ={})
    assert "`toy_limit` *(serve only)* | `-T COUNT`, `--toy-limit COUNT` | " \
        "`OTEL_GPU_TOY_LIMIT` | `3` | a toy setting for this test |" in docs.settings_table(options)


def test_readme_settings_table_is_generated_from_the_rows():
    on_disk = (ROOT / "README.md").read_text(encoding="utf-8")
    assert on_disk == docs.with_table(on_disk), (
        "the README settings table is stale: run `python -m otel_gpu.config.docs README.md`"
    )
    table = on_disk.partition(docs.BEGIN)[2].partition(docs.END)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [o.key for o in OPTIONS]


def test_a_config_error_is_caught_as_a_setup_error_and_a_value_error():
    """What the CLI (``except SetupError``) and callers of ``load`` (``except ValueError``)
    catch: one line naming the setting and where it came from."""
    for caught in (SetupError, ValueError):
        with pytest.raises(caught) as info:
            load({}, environ={"OTEL_GPU_INTERVAL": "soon"})
        text = str(info.value)
        assert text.startswith("interval (from environment variable OTEL_GPU_INTERVAL): "), text
        assert "\n" not in text


# --- null, shapes, ranges: every setting by the same rules ------------------------------------


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.key)
def test_null_in_the_file_means_the_default(tmp_path, option):
    path = tmp_path / "c.yaml"
    path.write_text(f"{option.key}:\n")
    assert load({}, environ={}, config_file=str(path)) == load({}, environ={})
    path.write_text(f"{option.key}: ~\n")
    assert load({}, environ={}, config_file=str(path)) == load({}, environ={})


NULL_DOCUMENTS = {
    "tilde": "~\n",
    "null": "null\n",
    "document-start": "---\n",
    "document-start-then-comments": "---\n# interval: 5s\n# listen: :9400\n",
}
"""Files holding a null document: no settings, as an empty or comment-only file."""


@pytest.mark.parametrize("text", NULL_DOCUMENTS.values(), ids=NULL_DOCUMENTS.keys())
def test_a_null_config_file_means_every_default(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert load({}, environ={}, config_file=str(path)) == load({}, environ={})
    env = {"OTEL_GPU_INTERVAL": "5s"}
    assert load({}, environ=env, config_file=str(path)).interval == 5.0


@pytest.mark.parametrize("text", NULL_DOCUMENTS.values(), ids=NULL_DOCUMENTS.keys())
def test_a_null_web_config_is_no_web_config(tmp_path, text):
    """The web config takes a null document as the config file does: no TLS, no auth."""
    path = tmp_path / "web.yaml"
    path.write_text(text)
    web = load_web_config(str(path))
    assert web.tls is None and not web.users


def test_a_quoted_null_is_text_not_an_absent_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text('"null"\n')
    with pytest.raises(ConfigError, match="expected a mapping of settings at the top level"):
        load({}, environ={}, config_file=str(path))


def test_null_in_the_file_leaves_variables_and_flags_in_charge(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("interval: null\npod_attribution: ~\n")
    env = {"OTEL_GPU_INTERVAL": "5s", "OTEL_GPU_POD_ATTRIBUTION": "false"}
    cfg = load({}, environ=env, config_file=str(path))
    assert cfg.interval == 5.0 and cfg.pod_attribution is False
    assert load({"interval": "2s"}, environ={}, config_file=str(path)).interval == 2.0
    assert load({}, environ={}, config_file=str(path)).pod_attribution is True


DURATIONS = [
    # key, lowest, highest, just below, just above, the range in the message
    ("interval", "100ms", "1h", "99ms", "3601", "100ms to 1h"),
    ("kubelet_interval", "100ms", "60m", "0.05", "1.5h", "100ms to 1h"),
    ("kubelet_timeout", "0.1", "5m", "50ms", "301s", "100ms to 5m"),
    ("kubelet_grace_period", "100ms", "24h", "10ms", "25h", "100ms to 24h"),
    ("otlp_interval", "1s", "1h", "999ms", "61m", "1s to 1h"),
    ("otlp_timeout", "100ms", "300", "0.09", "6m", "100ms to 5m"),
]


@pytest.mark.parametrize(("key", "low", "high", "below", "above", "span"), DURATIONS)
def test_every_duration_has_a_range_said_in_the_error(key, low, high, below, above, span):
    option = next(o for o in OPTIONS if o.key == key)
    assert span in option.help
    assert getattr(load({key: low}, environ={}), key) == parse_duration(low)
    assert getattr(load({key: high}, environ={}), key) == parse_duration(high)
    for bad in (below, above, "20000000000"):
        with pytest.raises(ConfigError, match=rf"^{key} \(from flag --[a-z-]+\): must be from "
                                              rf"{span}, got '{bad}'$"):
            load({key: bad}, environ={})


@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", "1e999", str(10**400), "[]", "{}"])
@pytest.mark.parametrize("key", [d[0] for d in DURATIONS])
def test_durations_from_the_file_are_finite_numbers(tmp_path, key, text):
    path = tmp_path / "c.yaml"
    path.write_text(f"{key}: {text}\n")
    with pytest.raises(ConfigError, match=rf"^{key} \(from config file .*\): ") as info:
        load({}, environ={}, config_file=str(path))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 10**400, [1], None])
def test_parse_duration_refuses_what_is_not_a_finite_positive_number(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kubelet_socket: [a, b]\n", r"^kubelet_socket \(from config file .*\): expected a "
                                     r"string, got a list$"),
        ("node_name: {a: b}\n", r"^node_name \(from config file .*\): expected a string, "
                                r"got a mapping$"),
        ("listen: !!binary aGk=\n", r"^listen \(from config file .*\): expected HOST:PORT such "
                                    r"as 0.0.0.0:9400, got binary data$"),
        ("simulate: 2024-01-01\n", r"^simulate \(from config file .*\): expected a string, "
                                   r"got a date"),
        ("sysfs_root: true\n", r"^sysfs_root \(from config file .*\): expected a string, got a "
                               r"boolean \(true\)$"),
        ("kubelet_socket: ''\n", r"^kubelet_socket \(from config file .*\): must not be empty$"),
        ("node_name: \"a\\x00b\"\n", r"^node_name \(from config file .*\): contains a control "
                                     r"character"),
        ("naming: [otel, [dcgm]]\n", r"^naming \(from config file .*\): expected a list of names, "
                                     r"but item 2 is a list$"),
        ("kubelet_resource_names: {a: 1}\n", r"^kubelet_resource_names \(from config file .*\): "
                                             r"expected a list or a comma-separated string, got a "
                                             r"mapping$"),
        ("log_level: [info]\n", r"^log_level \(from config file .*\): expected one of debug, "
                                r"info, warning, error, got a list$"),
        ("interval: 10s\ninterval: 20s\n", r"^config file .*: duplicate key 'interval' at line 2"),
        ("a: &x 1\nb: *x\n", r"^config file .*: YAML aliases \(\*x\) are not allowed"),
        ("interval: !!int x\n", r"^interval \(from config file .*\): expected a duration like "
                                r"10s, 500ms or 2.5, got 'x' tagged !!int, which YAML cannot "
                                r"read as that \(line 1\)$"),
        ("interval: !!timestamp xyz\n", r"^interval \(from config file .*\): expected a "
                                        r"duration like 10s, 500ms or 2.5, got 'xyz' tagged "
                                        r"!!timestamp"),
        ("naming: [otel, !!bool maybe]\n", r"^naming \(from config file .*\): expected a list "
                                           r"of names, but item 2 is 'maybe' tagged !!bool"),
        ("intervall: !!timestamp xyz\n", r"^config file .*: unknown key 'intervall'"),
    ],
)
def test_each_setting_from_the_file_has_the_shape_of_its_row(tmp_path, text, expected):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load({}, environ={}, config_file=str(path))
    assert re.search(expected, str(info.value)), str(info.value)


def test_list_settings_take_lists_or_comma_separated_text(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kubelet_resource_names: [example.com/gpu, 7]\nnaming: otel, dcgm\n")
    cfg = load({}, environ={}, config_file=str(path))
    assert cfg.kubelet_resource_names == ("example.com/gpu", "7")
    assert cfg.naming == ("otel", "dcgm")
    assert [o.key for o in OPTIONS if o.many] == [
        "kubelet_resource_names", "naming", "exporters"]


def test_config_file_is_read_as_text_of_bounded_size(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"interval: 10s # \xff\n")
    with pytest.raises(ConfigError, match=r"^config file .*c.yaml: not UTF-8 text"):
        load({}, environ={}, config_file=str(path))
    with pytest.raises(ConfigError, match=r"^config file /dev/zero: not a regular file"):
        load({}, environ={}, config_file="/dev/zero")


def test_a_counters_file_needs_the_dcgm_naming():
    with pytest.raises(ConfigError, match=r"^collectors \(from flag -f/--collectors\): a counters "
                                          r"file is only used by the dcgm naming profile, and "
                                          r"naming is otel; add dcgm"):
        load({"collectors": "counters.csv"}, environ={})
    env = {"OTEL_GPU_COLLECTORS": "counters.csv", "OTEL_GPU_NAMING": "kubelet"}
    with pytest.raises(ConfigError, match=r"^collectors \(from environment variable "
                                          r"OTEL_GPU_COLLECTORS\): .* naming is kubelet;"):
        load({}, environ=env)
    cfg = load({"collectors": "counters.csv", "naming": "otel,dcgm"}, environ={})
    assert cfg.collectors == "counters.csv"


@pytest.mark.parametrize(("good", "parsed"), [
    ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9400", ("::1", 9400)),
    ("localhost:80", ("localhost", 80)), (":9400", ("0.0.0.0", 9400)),
    ("node-7.example.com:9400", ("node-7.example.com", 9400)),
    ("[fe80::1%eth0]:9400", ("fe80::1%eth0", 9400)),
])
def test_listen_accepts_addresses_and_host_names(good, parsed):
    assert parse_listen(good) == parsed


@pytest.mark.parametrize("bad", ["bad host:80", "[nothost]:80", "a\x00b:80", "host:٣", "[::1:80",
                                 "-x:80", 9400])
def test_listen_refuses_what_cannot_be_bound(bad):
    with pytest.raises(ValueError):
        parse_listen(bad)


@pytest.mark.parametrize("good", ["http://collector:4318", "https://[::1]:4317/v1/metrics",
                                  "collector:4317", "HTTP://c"])
def test_otlp_endpoint_accepts_urls_and_host_port(good):
    assert load({"otlp_endpoint": good}, environ={}).otlp_endpoint == good


@pytest.mark.parametrize(("bad", "why"), [
    ("http://[::1", "not a valid URL"), ("http://c:99999", "not a valid URL"),
    ("ftp://c:21", "expected an http:// or https:// URL"), ("http://", "with a host"),
    ("collector", "expected a URL such as"), ("http://c:0", "port must be 1..65535"),
    ("http://c:4318/v1 metrics", "must not contain spaces"),
])
def test_otlp_endpoint_refuses_what_the_exporter_cannot_use(bad, why):
    with pytest.raises(ConfigError, match=r"^otlp_endpoint \(from flag --otlp-endpoint\): ") as i:
        load({"otlp_endpoint": bad}, environ={})
    assert why in str(i.value)


# --- YAML tags: every tag the safe loader resolves, against every setting ---------------------

TAGS = ["!!timestamp", "!!binary", "!!set", "!!omap", "!!pairs", "!!float", "!!int", "!!bool",
        "!!null", "!!str", "!custom"]
_INTERNAL = ("NoneType", "object has no attribute", "invalid literal", "could not convert",
             "groupdict", "Traceback", "KeyError", "base64", "constructor", "unhashable")
_TEXT = st.one_of(
    st.sampled_from(["xyz", "2024-01-01", "2024-01-01 10:00:00", "aGk=", "10s", "1", "0", "-1",
                     "true", "maybe", ".nan", ".inf", "0.0.0.0:9400", "otel", "", "~", "1e999"]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12),
)
_FLOW = st.sampled_from(["{a}", "{a: 1}", "[a: 1]", "[a, b]", "[]", "{}", "[[a]]", "{otel}",
                         "[otel: 1, dcgm: 2]", "[a, !!int x]"])


def _expected(option: Option) -> str:
    """What the setting's own parser says it takes ("expected ..."), asked with no value."""
    with pytest.raises(ValueError) as info:
        option.parse(object())
    return str(info.value).partition(", got")[0].partition(", but")[0]


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.key)
@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tag=st.sampled_from(TAGS), value=_TEXT.map(json.dumps) | _FLOW)
def test_a_tagged_value_is_refused_naming_the_setting_and_what_it_takes(tmp_path, option,
                                                                        tag, value):
    path = tmp_path / "c.yaml"
    path.write_text(f"{option.key}: {tag} {value}\n", encoding="utf-8")
    try:
        cfg = load({}, environ={}, config_file=str(path))
    except ConfigError as exc:
        message = str(exc)
    else:
        assert _is(getattr(cfg, option.key), option.type), (option.key, tag, value)
        return
    assert "\n" not in message, message
    assert message.startswith(f"{option.key} (from config file {path}): "), message
    assert not any(word in message for word in _INTERNAL), message
    said = message.partition("): ")[2]
    if tag in ("!!timestamp", "!!binary", "!!set", "!!omap", "!!pairs", "!custom") \
            or value.startswith(("{", "[")):
        # the value is of no kind the setting takes: the message says what it takes
        assert said.startswith("expected "), message
    if "tagged" in said:  # YAML could not build it: the setting's own words for what it takes
        assert said.startswith((_expected(option), "expected a list of names")), message


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.key)
def test_every_setting_says_what_it_takes(option):
    assert _expected(option).startswith("expected "), option.key


def test_unknown_otel_gpu_variables_are_named_with_the_closest_setting():
    environ = {"OTEL_GPU_INTERVL": "5", "OTEL_GPU_INTERVAL": "5", "OTEL_GPU_CONFIG": "c.yaml",
               "OTEL_GPU_ZZZ": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": "x", "NODE_NAME": "n",
               "_OTEL_GPU_LIBRARY_LOG_WINDOW": "1"}
    assert config.unknown_variables(environ) == [
        "environment variable OTEL_GPU_INTERVL is not a setting and is ignored "
        "(did you mean OTEL_GPU_INTERVAL?)",
        "environment variable OTEL_GPU_ZZZ is not a setting and is ignored",
    ]
    assert config.unknown_variables({o.env: "" for o in OPTIONS}) == []
