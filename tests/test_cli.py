"""The command line in-process: flags built from the settings, and setup errors as exit 2.

The real process end to end is in ``tests/e2e/test_cli.py``.
"""

from __future__ import annotations

import pytest

from otel_gpu import cli
from otel_gpu.config import OPTIONS, ConfigError, load
from otel_gpu.export.naming.dcgm import CollectorsError
from otel_gpu.export.otlp.transport import OtlpSetupError
from otel_gpu.export.prometheus.webconfig import WebConfigError
from otel_gpu.sample.library import NvmlUnavailable
from otel_gpu.sim import ScenarioError
from tests.support.nvml import RefusingNvml


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args([*argv, "--help"])
    assert info.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", [(), ("serve",), ("check",)])
def test_every_setting_is_a_flag_with_its_rows_metavar_and_help(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping: argparse may break lines at a hyphen
    text = _help(capsys, *command)
    for option in OPTIONS:
        flags = ", ".join(f"{flag} {option.metavar}" for flag in option.flags)
        if command == ("check",) and option.serve_only:
            assert f"{option.flag} " not in text, option.key
            continue
        assert flags in text, option.key
        assert " ".join(cli.help_text(option).split()) in text, option.key
    assert "-f CSV, --collectors CSV" in text


@pytest.mark.parametrize("command", [(), ("serve",), ("check",)])
def test_help_shows_no_python_values_and_each_default_once(capsys, command):
    text = _help(capsys, *command)
    for word in ("None", "True", "False", "default )"):
        assert word not in text, word
    for option in OPTIONS:
        said = cli.help_text(option)
        assert said.count("default") <= 1, said
        if isinstance(option.default, bool):
            assert f"; default {str(option.default).lower()})" in said, said
    assert "(default: the NODE_NAME variable) ($OTEL_GPU_NODE_NAME)" in _help(capsys)


def test_check_lists_only_the_flags_it_uses(capsys):
    assert not hasattr(cli, "SERVE_ONLY")  # the rows say it (Option.serve_only), nothing else
    assert {o.key for o in OPTIONS if o.serve_only} == {
        "listen", "health_listen", "interval", "node_name", "kubelet_interval",
        "kubelet_grace_period", "dcgm_hostname_label", "dcgm_shared_gpu_copies", "dcgm_devices",
        "dcgm_pod_label_style", "dcgm_names", "pod_identity", "otlp_compression", "otlp_timeout",
        "otlp_interval", "otlp_temporality", "device_attributes"}
    text = _help(capsys, "check")
    for flag in ("--listen", "--health-listen", "--interval", "--otlp-interval",
                 "--dcgm-devices", "--kubelet-grace-period"):
        assert f"{flag} " not in text, flag
    for flag in ("--simulate", "--pod-attribution", "--kubelet-socket", "--web-config-file",
                 "--otlp-endpoint", "-f", "--naming", "--log-level"):
        assert f"{flag} " in text, flag
    # not listed, but accepted (one set of arguments for serve and check) and checked
    args = cli.build_parser().parse_args(["check", "--listen", "127.0.0.1:1"])
    assert cli._config(args).listen == ("127.0.0.1", 1)
    _expect_exit_2_with(capsys, ["check", "--interval", "0"], "interval")


def test_flags_land_on_their_settings():
    args = cli.build_parser().parse_args(
        ["serve", "--interval", "250ms", "--naming", "otel,dcgm", "-f", "counters.csv",
         "--otlp-insecure", "true"]
    )
    config = cli._config(args)
    assert config.interval == 0.25
    assert config.collectors == "counters.csv"
    assert config.otlp_insecure is True
    assert config.listen == load({}, environ={}).listen


def _open_nvml_failing_with(monkeypatch, capsys, error: Exception) -> str:
    import otel_gpu.wiring

    monkeypatch.setattr(otel_gpu.wiring, "open_nvml", lambda simulate: RefusingNvml(error))
    with pytest.raises(SystemExit) as info:
        cli._open_nvml(load({}, environ={}))
    assert info.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize(
    "error", [ConfigError, OtlpSetupError, WebConfigError, CollectorsError, ScenarioError]
)
def test_every_setup_error_is_its_one_line_and_exit_2(monkeypatch, capsys, error):
    """The CLI catches them as setup errors: the user sees the message, no traceback."""
    err = _open_nvml_failing_with(monkeypatch, capsys, error("the one line"))
    assert err == "otel-gpu: error: the one line"


def test_nvml_unavailable_is_told_with_how_to_run_without_a_gpu(monkeypatch, capsys):
    """Not a setup error: it gets the driver hint a plain setup error would not."""
    err = _open_nvml_failing_with(monkeypatch, capsys, NvmlUnavailable("LIBRARY_NOT_FOUND"))
    assert err.startswith("otel-gpu: error: NVML could not be loaded: LIBRARY_NOT_FOUND. ")
    assert err.endswith("To run without a GPU: otel-gpu --simulate h100x8")


def test_a_bad_scenario_exits_2_with_one_line(capsys):
    config = load({"simulate": "no-such-profile"}, environ={})
    with pytest.raises(SystemExit) as info:
        cli._open_nvml(config)
    assert info.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("otel-gpu: error: ") and "no-such-profile" in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, 60.0), ("0.5", 0.5), ("0", 60.0), ("-1", 60.0), ("soon", 60.0)]
)
def test_library_log_window_is_a_minute_unless_cut_for_tests(value, seconds):
    from otel_gpu._log import LIBRARY_WINDOW_ENV, library_window

    environ = {} if value is None else {LIBRARY_WINDOW_ENV: value}
    assert library_window(environ) == seconds


def _expect_exit_2_with(capsys, argv: list[str], needle: str) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("otel-gpu: error: ") and len(err.strip().splitlines()) == 1, err
    assert needle in err, err


@pytest.mark.parametrize(("extra", "files", "needle"), [
    (["--naming", "dcgm", "-f", "{d}/counters.csv"], {"counters.csv": "not a line\n"},
     "collectors file {d}/counters.csv: line 1:"),
    (["--web-config-file", "{d}/web.yml"], {"web.yml": "colour: blue\n"}, "web config {d}/web.yml"),
    (["--otlp-endpoint", "http://127.0.0.1:9", "--otlp-headers-file", "{d}/absent"], {},
     "OTLP headers file {d}/absent: cannot read it"),
    (["--exporters", "otlp", "--otlp-protocol", "http/protobuf", "--otlp-endpoint", "c:4318"], {},
     "otlp_endpoint: http/protobuf needs a URL"),
])
def test_check_refuses_the_files_serve_refuses(capsys, tmp_path, extra, files, needle):
    """Before NVML is opened: nothing else is printed, the driver is never touched."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    argv = ["check", "--simulate", "no-such-profile", *(a.replace("{d}", str(tmp_path))
                                                        for a in extra)]
    _expect_exit_2_with(capsys, argv, needle.replace("{d}", str(tmp_path)))


def test_a_config_file_that_cannot_be_read_is_one_line(capsys, tmp_path):
    (tmp_path / "c.yaml").write_bytes(b"interval: \xff\n")
    _expect_exit_2_with(capsys, ["check", "--config", str(tmp_path / "c.yaml")], "not UTF-8 text")


@pytest.mark.parametrize(("argv", "needle"), [
    (["--simualte", "h100x8"], "unknown flag --simualte (did you mean --simulate?)"),
    (["check", "--intervall=5s"], "unknown flag --intervall (did you mean --interval?)"),
    (["metrics", "--formt", "markdown"], "unknown flag --formt (did you mean --format?)"),
    (["--zzzzzz"], "unknown flag --zzzzzz (see otel-gpu --help)"),
])
def test_an_unknown_flag_is_named_with_the_closest_known_one(capsys, argv, needle):
    _expect_exit_2_with(capsys, argv, needle)


@pytest.mark.parametrize(("argv", "key", "value"), [
    (["--sim", "t4"], "simulate", "t4"),
    (["check", "--pod-attr", "false"], "pod_attribution", "false"),
])
def test_prefixes_argparse_takes_are_not_unknown(argv, key, value):
    parser = cli.build_parser()
    cli.refuse_unknown_flags(parser, argv)  # no SystemExit
    known, _ = parser.parse_known_args(argv)
    assert getattr(known, key) == value  # the prefix is the flag it abbreviates


def test_what_follows_a_double_dash_is_no_flag(capsys):
    cli.refuse_unknown_flags(cli.build_parser(), ["--interval", "5s", "--", "--not-a-flag"])
    assert capsys.readouterr().err == ""  # not named as an unknown flag


def test_a_mistyped_variable_is_warned_about_at_start_up(capsys, monkeypatch, caplog):
    monkeypatch.setenv("OTEL_GPU_SIMULTE", "t4")
    monkeypatch.setattr(cli, "check", lambda config: cli.EXIT_OK)
    monkeypatch.setattr(cli, "configure_logging", lambda level, fmt: None)
    with caplog.at_level("WARNING", logger="otel_gpu"):
        assert cli.main(["check", "--simulate", "t4"]) == cli.EXIT_OK
    lines = [r.getMessage() for r in caplog.records if "OTEL_GPU_SIMULTE" in r.getMessage()]
    assert lines == ["environment variable OTEL_GPU_SIMULTE is not a setting and is ignored "
                     "(did you mean OTEL_GPU_SIMULATE?)"]


@pytest.fixture
def stderr_log():
    """The collector's logging set up on a buffer; the handlers put back afterwards."""
    import io
    import logging

    from otel_gpu._log import configure

    root = logging.getLogger()
    before, level = list(root.handlers), logging.getLogger("otel_gpu").level
    stream = io.StringIO()
    configure("info", stream=stream)
    try:
        yield stream
    finally:
        root.handlers[:] = before
        logging.getLogger("otel_gpu").setLevel(level)


def test_a_start_prints_its_info_lines_once_started_in_order(stderr_log):
    import logging

    log = logging.getLogger("otel_gpu.test")
    with cli._starting() as starting:
        log.info("first")
        log.warning("a warning passes at once")
        log.info("second")
        assert "first" not in stderr_log.getvalue()
        assert "a warning passes at once" in stderr_log.getvalue()
        starting.started()
        log.info("third")
    log.info("fourth")
    lines = [line.split(": ", 1)[1] for line in stderr_log.getvalue().splitlines()]
    assert lines == ["a warning passes at once", "first", "second", "third", "fourth"]
    assert not any(isinstance(f, cli._HeldBack) for h in logging.getLogger().handlers
                   for f in h.filters)


def test_a_failed_start_drops_its_info_lines(stderr_log):
    import logging

    log = logging.getLogger("otel_gpu.test")
    with pytest.raises(SystemExit), cli._starting():
        log.info("simulating NVML with scenario t4")
        cli._die("listen 8.8.8.8:9400: Cannot assign requested address")
    log.info("after")
    assert stderr_log.getvalue().splitlines()[-1].endswith("after")
    assert "simulating" not in stderr_log.getvalue()
