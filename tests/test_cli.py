"""The command line in-process: flags built from the settings, and setup errors as exit 2.

The real process end to end is in ``tests/e2e/test_cli.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from otel_gpu import cli
from otel_gpu.config import OPTIONS, ConfigError, load
from otel_gpu.export.http.webconfig import WebConfigError
from otel_gpu.export.naming.dcgm import CollectorsError
from otel_gpu.export.otlp.transport import OtlpSetupError
from otel_gpu.report import check_report, print_report
from otel_gpu.sample.library import NvmlUnavailable
from otel_gpu.sim import ScenarioError
from tests.support.configs import help_invocation
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
        flags = help_invocation(option.flags, option.metavar)
        if command == ("check",) and option.serve_only:
            assert f"{option.flag} " not in text, option.key
            continue
        assert flags in text, option.key
        assert " ".join(cli.help_text(option).split()) in text, option.key
    assert help_invocation(("-f", "--collectors"), "CSV") in text


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
        "otlp_interval", "otlp_temporality", "device_attributes", "prometheus_utf8_names",
        "idle_threshold"}
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
    monkeypatch.setattr(cli, "check", lambda config, fmt: cli.EXIT_OK)
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


FOREIGN_FLAGS = {
    "port": (["--port", "9400"],
             "--port: otel-gpu listens with --listen HOST:PORT (did you mean --listen :9400?)"),
    "port=": (["--port=9400"], "(did you mean --listen :9400?)"),
    "node-listen": (["--web.listen-address", ":9100"],
                    "--web.listen-address is node_exporter's: otel-gpu listens with --listen "
                    "HOST:PORT (did you mean --listen :9100?)"),
    "node-listen-one-dash": (["-web.listen-address=:9100"], "(did you mean --listen :9100?)"),
    "node-web-config": (["--web.config.file", "web.yml"],
                        "(did you mean --web-config-file web.yml?)"),
    "node-path": (["--web.telemetry-path", "/m"], "serves its metrics at /metrics only"),
    "node-log-level": (["--log.level", "debug"], "(did you mean --log-level debug?)"),
    "node-log-format": (["--log.format", "logfmt"], "(did you mean --log-format text?)"),
    "dcgm-a": (["-a", ":9400"], "-a is dcgm-exporter's: otel-gpu listens with --listen "
                                "HOST:PORT (did you mean --listen :9400?)"),
    "dcgm-address": (["serve", "--address=:9500"], "(did you mean --listen :9500?)"),
    "dcgm-c": (["-c", "30000"], "-c is dcgm-exporter's: otel-gpu samples every --interval "
                                "DURATION (10s, 500ms), not milliseconds (did you mean "
                                "--interval 30s?)"),
    "dcgm-collect-interval": (["check", "--collect-interval", "500"],
                              "(did you mean --interval 500ms?)"),
    "dcgm-d": (["-d", "g+i"], "(did you mean --naming dcgm --dcgm-devices both?)"),
    "dcgm-o": (["-o"], "(did you mean --naming dcgm --dcgm-pod-label-style old?)"),
    "dcgm-k": (["--kubernetes"], "otel-gpu labels pods by default: leave it out"),
    "dcgm-debug": (["--debug"], "(did you mean --log-level debug?)"),
}


@pytest.mark.parametrize(("argv", "needle"), FOREIGN_FLAGS.values(), ids=FOREIGN_FLAGS.keys())
def test_another_exporters_flag_is_answered_with_otel_gpus(capsys, argv, needle):
    _expect_exit_2_with(capsys, argv, needle)


def test_no_other_exporters_flag_is_or_abbreviates_one_of_ours():
    """Else the hint would hide a flag of ours, or argparse would take it as our prefix."""
    from otel_gpu.config.foreign import BY_FLAG

    ours = cli._flags(cli.build_parser())
    for flag in BY_FLAG:
        assert not any(known.startswith(flag) for known in ours if flag.startswith("--")), flag
        assert flag not in ours, flag


def test_the_migration_guide_lists_every_other_exporters_flag():
    from pathlib import Path

    from otel_gpu.config.foreign import BY_FLAG

    guide = (Path(__file__).resolve().parents[1] / "docs" / "migration.md").read_text()
    for flag in BY_FLAG:
        assert f"`{flag}" in guide, flag


@pytest.mark.parametrize(("argv", "needle"), [
    (["-simulate", "h100x8"], "unknown flag -simulate (did you mean --simulate?)"),
    (["-simulate=h100x8"], "unknown flag -simulate (did you mean --simulate?)"),
    (["check", "-pod-attr", "false"], "unknown flag -pod-attr (did you mean --pod-attribution?)"),
    (["-simulte", "t4"], "unknown flag -simulte (did you mean --simulate?)"),
    (["-x"], "unknown flag -x (see otel-gpu --help)"),
])
def test_a_long_flag_with_one_dash_is_named_with_its_two_dash_form(capsys, argv, needle):
    _expect_exit_2_with(capsys, argv, needle)


@pytest.mark.parametrize(("argv", "needle"), [
    (["chek"], "unknown command 'chek' (did you mean check?)"),
    (["--simulate", "t4", "metric"], "unknown command 'metric' (did you mean metrics?)"),
    (["h100x8"], "unknown command 'h100x8' (see otel-gpu --help)"),
])
def test_an_unknown_command_is_named_with_the_closest_one(capsys, argv, needle):
    _expect_exit_2_with(capsys, argv, needle)


@pytest.mark.parametrize("argv", [
    ["-f", "counters.csv", "check"], ["-fcounters.csv", "check"], ["--interval", "-1", "check"],
    ["check", "--otlp-headers-file", "-odd-name"], ["--sim", "t4", "serve"],
])
def test_values_and_our_short_flags_are_left_to_argparse(capsys, argv):
    cli.refuse_unknown_flags(cli.build_parser(), argv)  # no SystemExit
    assert capsys.readouterr().err == ""


def test_an_address_in_use_on_9400_names_dcgm_exporter(capsys, monkeypatch):
    import errno

    import otel_gpu.wiring

    def busy(config, nvml):
        raise OSError(errno.EADDRINUSE, "Address already in use")

    monkeypatch.setattr(otel_gpu.wiring, "Service", busy)
    monkeypatch.setattr(cli, "_check_files", lambda config: None)
    for port, said in ((9400, True), (9401, False)):
        config = load({"simulate": "t4", "listen": f"127.0.0.1:{port}"}, environ={})
        with pytest.raises(SystemExit) as info:
            cli.serve(config)
        assert info.value.code == cli.EXIT_USAGE
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"otel-gpu: error: listen 127.0.0.1:{port}: Address already in use")
        assert len(err.splitlines()) == 1, err
        assert ("dcgm-exporter" in err and "--listen :9401" in err) is said, err


def _check_output(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["check", "--simulate", "a100-mig", *argv])
    return code, capsys.readouterr().out


def test_check_json_says_what_the_text_says(capsys, monkeypatch):
    import json

    monkeypatch.setattr(cli, "configure_logging", lambda level, fmt: None)
    code, out = _check_output(capsys, "--format", "json")
    assert code == cli.EXIT_OK
    report = json.loads(out)  # one document, nothing else on stdout
    assert set(report) == {"driver", "sample_seconds", "notes", "problems", "idle_allocations",
                           "devices"}
    assert report["driver"] and report["sample_seconds"] >= 0
    mig = [d for d in report["devices"] if d["mig_profile"] == "3g.20gb"]
    assert mig and all(d["uuid"].startswith("MIG-") for d in mig)
    gpu = report["devices"][0]
    assert {"index", "uuid", "name", "state", "held_by", "hpc_jobs", "gpu_time", "outside_use",
            "error", "hung", "values"} <= set(gpu)
    (memory,) = [v for v in gpu["values"] if v["metric"] == "hw.gpu.memory.usage"]
    assert memory["unit"] == "By" and isinstance(memory["value"], int)
    _, text = _check_output(capsys)
    assert text.startswith(f"driver {report['driver']}; {len(report['devices'])} device(s); ")
    assert f"\nGPU {gpu['index']}  {gpu['uuid']}  {gpu['name']}  state={gpu['state']}\n" in text
    assert f"  hw.gpu.memory.usage{' ' * 39} {memory['value']} By\n" in text
    values = sum(len(d["values"]) for d in report["devices"])
    assert values == sum(1 for line in text.splitlines() if line.startswith("  ")
                         and not line.startswith(("  held by", "  used by", "  error:", "  hung:",
                                                  "  time:")))


def test_check_json_names_pods_jobs_notes_and_problems(monkeypatch, capsys):
    """A sample with a pod, a job, a note and a problem: both forms say each."""
    import otel_gpu.instrument.schema as schema

    monkeypatch.setattr(schema, "device_observations", lambda metric, sample: ())
    holder = SimpleNamespace(namespace="ml", pod="train", container="main", replica=2)
    device = SimpleNamespace(index=0, uuid="GPU-1", name="Tesla T4", mig_profile=None,
                             is_mig=False)
    snapshot = SimpleNamespace(
        driver_version=None, duration=0.25, notes=("a note",), errors=("a problem",),
        devices=(SimpleNamespace(device=device, state="ok", error="lost", hung=None),),
        pods=SimpleNamespace(attribution=SimpleNamespace(holders=lambda uuid: (holder,))),
        series_jobs=lambda uuid: (SimpleNamespace(job_id="1234"),), gpu_time=None)
    report = check_report(snapshot)  # only what the report reads
    assert report["driver"] is None and report["notes"] == ["a note"]
    assert report["problems"] == ["a problem"]
    (dev,) = report["devices"]
    assert dev["held_by"] == [{"namespace": "ml", "pod": "train", "container": "main",
                               "replica": 2}]
    assert dev["hpc_jobs"] == ["1234"] and dev["error"] == "lost"
    print_report(report)
    assert capsys.readouterr().out.splitlines() == [
        "driver unknown; 1 device(s); sample took 250 ms", "note: a note",
        "problem: a problem", "", "GPU 0  GPU-1  Tesla T4  state=ok",
        "  held by ml/train/main (replica 2)", "  used by HPC job 1234", "  error: lost"]
