"""Bad input through the real CLI: exit 2, one line, never a traceback, never a hang.

Every case runs as ``otel-gpu serve`` and as ``otel-gpu check`` (in simulation),
in a child process with a time limit and a bounded address space, and must
end with exit status 2 and exactly one non-empty line on stderr, starting
with ``otel-gpu: error:`` and naming the setting or file at fault. A
generated set (hypothesis) then throws random YAML documents and values at
:func:`otel_gpu.config.load` in-process, and a few of them at the real CLI.
"""

from __future__ import annotations

import math
import os
import string
import subprocess
import sys
import tempfile
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_gpu.config import OPTIONS, load
from otel_gpu.errors import SetupError
from testkit.process import ROOT
from tests.support.certs import make_certs

TIME_LIMIT_S = 10.0
"""A bad value is refused at start-up, long before this."""
MEMORY_LIMIT = 3 << 30
"""Address space of the child: an alias bomb or /dev/zero must not get near it."""
SECRET = "s3cr3t-t0ken"
SINK = "http://127.0.0.1:9"  # an OTLP endpoint; nothing is sent before start-up ends


# The limit is set by the child itself, before it becomes otel-gpu: a preexec_fn would make
# subprocess fork() this test process, whose gRPC (loaded by other tests) then writes its
# fork handlers' complaints into the child's stderr.
_BOUNDED = (
    "import os, resource, sys; "
    f"resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT})); "
    "os.execv(sys.executable, [sys.executable, '-m', 'otel_gpu', *sys.argv[1:]])"
)


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``python -m otel_gpu ARGS`` with a time limit and bounded memory: (code, out, err)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NODE_NAME"))}
    full_env.update(env or {})
    done = subprocess.run(
        [sys.executable, "-c", _BOUNDED, *args], cwd=ROOT, env=full_env,
        stdin=subprocess.DEVNULL, capture_output=True, timeout=TIME_LIMIT_S,
    )
    decode = lambda b: b.decode("utf-8", "backslashreplace")  # noqa: E731
    return done.returncode, decode(done.stdout), decode(done.stderr)


def _one_error_line(code: int, err: str) -> str:
    assert "Traceback" not in err, err
    assert code == 2, f"exit {code}:\n{err}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("otel-gpu: error: "), err
    return lines[0]


COMMANDS = {
    "serve": ("serve", "--listen", "127.0.0.1:0", "--simulate", "t4"),
    "check": ("check", "--simulate", "t4", "--pod-attribution", "false"),
}


# --- the cases --------------------------------------------------------------------------

def _bomb(levels: int = 9) -> str:
    """A "billion laughs" list: ``levels`` anchored lists, each nine aliases of the last."""
    rows = ["&l0 [" + ", ".join(["lol"] * 9) + "]"]
    for level in range(1, levels):
        rows.append(f"&l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]")
    return "[" + ", ".join(rows) + "]"


@dataclass(frozen=True)
class Case:
    """Files to write in a fresh folder, the arguments (``{d}``: that folder), the error."""

    args: tuple[str, ...]
    needle: str
    files: dict[str, bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    fifo: str | None = None
    certs: bool = False


def _cfg(text: str | bytes, needle: str) -> Case:
    data = text.encode() if isinstance(text, str) else text
    return Case(("--config", "{d}/c.yaml"), needle, {"c.yaml": data})


def _scenario(text: str, needle: str) -> Case:
    return Case(("--simulate", "{d}/s.yaml"), needle, {"s.yaml": text.encode()})


def _headers(data: bytes, needle: str) -> Case:
    return Case(("--otlp-endpoint", SINK, "--otlp-headers-file", "{d}/headers"), needle,
                {"headers": data})


GPU = "devices:\n  - name: Tesla T4\n"
DCGM = ("--naming", "otel,dcgm")

CASES: dict[str, Case] = {
    # 7. bytes that are not UTF-8
    "p7-config-not-utf8": _cfg(b"interval: 10s\n# caf\xe9\n",
                               "config file {d}/c.yaml: not UTF-8 text (byte 0xe9"),
    "p7-collectors-not-utf8": Case(
        (*DCGM, "-f", "{d}/counters.csv"), "collectors file {d}/counters.csv: not UTF-8",
        {"counters.csv": b"DCGM_FI_DEV_GPU_TEMP, gauge, temp\xff\n"}),
    "p7-headers-not-utf8": _headers(b"authorization=\xff\n",
                                    "OTLP headers file {d}/headers: not UTF-8"),
    # 8. what would exhaust or block the process
    "p8-deep-nesting": _cfg("kubelet_resource_names: " + "[" * 50_000, "nested deeper than"),
    "p8-alias-bomb-in-a-list-setting": _cfg(f"kubelet_resource_names: {_bomb()}\n",
                                            "YAML aliases (*l0) are not allowed"),
    "p8-alias-bomb-in-scenario-devices": _scenario(
        f"devices:\n  - name: {_bomb()}\n", "scenario {d}/s.yaml: invalid YAML: YAML aliases"),
    "p8-dev-zero-config": Case(("--config", "/dev/zero"),
                               "config file /dev/zero: not a regular file (a character device)"),
    "p8-dev-zero-headers": Case(("--otlp-endpoint", SINK, "--otlp-headers-file", "/dev/zero"),
                                "OTLP headers file /dev/zero: not a regular file"),
    "p8-fifo-config": Case(("--config", "{d}/fifo"), "config file {d}/fifo: not a regular file "
                           "(a FIFO)", fifo="fifo"),
    "p8-fifo-collectors": Case((*DCGM, "-f", "{d}/fifo"), "collectors file {d}/fifo: not a "
                               "regular file (a FIFO)", fifo="fifo"),
    # 9. durations out of range
    "p9-interval-huge": Case(("--interval", "20000000000"),
                             "interval (from flag --interval): must be from 100ms to 1h"),
    "p9-interval-inf": _cfg("interval: .inf\n", "interval (from config file {d}/c.yaml): must "
                            "be a finite duration"),
    "p9-interval-1ms": Case(("--interval", "1ms"), "interval (from flag --interval): must be "
                            "from 100ms to 1h, got '1ms'"),
    "p9-kubelet-interval-huge": Case(("--kubelet-interval", "20000000000"),
                                     "kubelet_interval (from flag --kubelet-interval): must be"),
    "p9-kubelet-timeout-1h": Case(("--kubelet-timeout", "1h"), "kubelet_timeout (from flag "
                                  "--kubelet-timeout): must be from 100ms to 5m"),
    "p9-kubelet-grace-period-too-long": Case(
        (), "kubelet_grace_period (from environment variable OTEL_GPU_KUBELET_GRACE_PERIOD): "
            "must be from 100ms to 24h", env={"OTEL_GPU_KUBELET_GRACE_PERIOD": "25h"}),
    "p9-otlp-interval-huge": Case(("--otlp-endpoint", SINK, "--otlp-interval", "20000000000"),
                                  "otlp_interval (from flag --otlp-interval): must be from 1s"),
    "p9-otlp-timeout-inf": _cfg(f"otlp_endpoint: {SINK}\notlp_timeout: .inf\n",
                                "otlp_timeout (from config file {d}/c.yaml): must be a finite"),
    # 11. OTLP
    "p11-endpoint-unclosed-ipv6": Case(("--otlp-endpoint", "http://[::1"), "otlp_endpoint (from "
                                       "flag --otlp-endpoint): not a valid URL"),
    "p11-endpoint-variable-unclosed-ipv6": Case(
        (), "OTEL_EXPORTER_OTLP_ENDPOINT: not a valid URL",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1"}),
    "p11-grpc-garbage-ca": Case(
        ("--otlp-protocol", "grpc", "--otlp-endpoint", "https://127.0.0.1:9",
         "--otlp-certificate", "{d}/ca.pem"),
        "otlp_certificate {d}/ca.pem: not a PEM CA certificate bundle",
        {"ca.pem": b"-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n"}),
    "p11-missing-certificate-variable": Case(
        ("--otlp-protocol", "grpc"),
        "OTEL_EXPORTER_OTLP_CERTIFICATE {d}/absent.pem: cannot read it (No such file",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:9",
             "OTEL_EXPORTER_OTLP_CERTIFICATE": "{d}/absent.pem"}),
    "p11-missing-certificate-flag": Case(
        ("--otlp-endpoint", "https://127.0.0.1:9", "--otlp-certificate", "{d}/absent.pem"),
        "otlp_certificate {d}/absent.pem: cannot read it (No such file"),
    "p11-client-key-does-not-match": Case(
        ("--otlp-endpoint", "https://127.0.0.1:9", "--otlp-client-certificate",
         "{certs}/client.crt", "--otlp-client-key", "{certs}/server.key"),
        "otlp_client_certificate {certs}/client.crt with otlp_client_key {certs}/server.key: "
        "not a usable PEM certificate", certs=True),
    "p11-client-key-alone": Case(
        ("--otlp-endpoint", "https://127.0.0.1:9", "--otlp-client-key", "{certs}/client.key"),
        "a client key needs a client certificate", certs=True),
    "p11-header-leading-space": _headers(
        f"x-tenant=a\nauthorization=%20Bearer%20{SECRET}\n".encode(),
        "line 2: header 'authorization': the value has leading or trailing spaces"),
    "p11-header-control-character": _headers(
        f"authorization=Bearer%0A{SECRET}\n".encode(),
        "line 1: header 'authorization': the value contains a control character"),
    "p11-header-name-not-a-token": _headers(
        f"authorization: Bearer {SECRET}=x\n".encode(),
        "line 1: the header name is not an HTTP token"),
    "p11-header-variable-not-encoded": Case(
        ("--otlp-endpoint", SINK), "OTEL_EXPORTER_OTLP_HEADERS: header 2: expected key=value",
        env={"OTEL_EXPORTER_OTLP_HEADERS": f"x-tenant=a,authorization=\"Bearer {SECRET}\""}),
    "p11-logs-exporter-unknown": Case(
        ("--otlp-endpoint", SINK), "OTEL_LOGS_EXPORTER: unsupported exporter 'console'",
        env={"OTEL_LOGS_EXPORTER": "console"}),
    "p11-logs-endpoint-variable-unclosed-ipv6": Case(
        ("--otlp-protocol", "grpc"), "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT: not a valid URL",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
             "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://[::1"}),
    # 12. scenarios
    "p12-count-huge": _scenario(GPU + "    count: 100000000\n",
                                "devices[0].count: at most 512 GPUs in a scenario"),
    "p12-power-inf": _scenario(GPU + "    power: .inf\n", "devices[0].power: expected a finite "
                               "number"),
    "p12-power-nan": _scenario(GPU + "    power: .nan\n", "devices[0].power: expected a finite "
                               "number"),
    "p12-step-inf": _scenario(GPU + "    temperature: {start: 40, step: -.inf}\n",
                              "devices[0].temperature.step: expected a finite number"),
    "p12-slow-forever": _scenario(
        GPU + "    slow: [{function: nvmlDeviceGetPowerUsage, seconds: .inf}]\n",
        "devices[0].slow[0].seconds: expected a finite number no larger than 3600"),
    # 13. silently accepted until now
    "p13-duplicate-key": _cfg("interval: 10s\nlog_level: info\ninterval: 1h\n",
                              "config file {d}/c.yaml: duplicate key 'interval' at line 3"),
    "p13-list-for-a-string": _cfg("kubelet_socket: [a, b]\n", "kubelet_socket (from config file "
                                  "{d}/c.yaml): expected a string, got a list"),
    "p13-mapping-for-a-string": _cfg("node_name: {a: b}\n", "node_name (from config file "
                                     "{d}/c.yaml): expected a string, got a mapping"),
    "p13-tag-read-as-another-type": _cfg("interval: !!timestamp xyz\n", "interval (from config "
                                         "file {d}/c.yaml): expected a duration like 10s, 500ms "
                                         "or 2.5, got 'xyz' tagged !!timestamp"),
    "p13-boolean-for-a-path": _cfg("sysfs_root: yes\n", "sysfs_root (from config file "
                                   "{d}/c.yaml): expected a string, got a boolean (true)"),
    "p13-collectors-without-dcgm": Case(
        ("-f", "{d}/counters.csv"), "collectors (from flag -f/--collectors): a counters file is "
        "only used by the dcgm naming profile",
        {"counters.csv": b"DCGM_FI_DEV_GPU_TEMP, gauge,\n"}),
    "p13-collectors-bad-line": Case(
        (*DCGM, "-f", "{d}/counters.csv"), "collectors file {d}/counters.csv: line 2: "
        "'DCGM_FI_DEV_GPU_TEMP;' is not a DCGM_FI_ field name",
        {"counters.csv": b"# fields\nDCGM_FI_DEV_GPU_TEMP;, gauge, temp\n"}),
    "p13-web-config-bad": Case(
        ("--web-config-file", "{d}/web.yml"), "web config {d}/web.yml",
        {"web.yml": b"tls_server_config:\n  cert_file: absent.crt\n  key_file: absent.key\n"}),
}


def _materialise(case: Case, tmp_path: Path) -> Callable[[str], str]:
    for name, data in case.files.items():
        (tmp_path / name).write_bytes(data)
    if case.fifo:
        os.mkfifo(tmp_path / case.fifo)
    certs = make_certs(tmp_path / "pki") if case.certs else None
    folder = str(certs.ca_cert.parent) if certs else ""

    def fill(text: str) -> str:
        return text.replace("{d}", str(tmp_path)).replace("{certs}", folder)

    if certs:  # name the files the cases use
        for src, dst in ((certs.client_cert, "client.crt"), (certs.client_key, "client.key"),
                         (certs.server_key, "server.key")):
            target = Path(folder) / dst
            if not target.exists():
                target.write_bytes(src.read_bytes())
    return fill


# `check` parses the same settings as `serve` and stops before serving. The full suite runs
# every case through both; the quick loop every fourth case through `check`.
@pytest.mark.parametrize("command", [
    pytest.param(c, marks=[pytest.mark.slow] if c == "serve" else []) for c in sorted(COMMANDS)
])
@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[pytest.mark.slow] if i % 4 else []) for i, name in enumerate(CASES)
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, name, command):
    case = CASES[name]
    fill = _materialise(case, tmp_path)
    args = [*COMMANDS[command], *(fill(a) for a in case.args)]
    env = {k: fill(v) for k, v in case.env.items()}
    code, out, err = _run(*args, env=env)
    line = _one_error_line(code, err)
    assert fill(case.needle) in line, line
    assert SECRET not in err + out


# --- 6. null means the default -------------------------------------------------------------

NULLS = "".join(f"{key}:\n" for key in (
    "interval", "naming", "log_level", "listen", "kubelet_socket", "kubelet_interval",
)) + "pod_attribution: ~\nweb_config_file: null\n"


def test_null_settings_take_their_defaults_in_serve(collector, tmp_path):
    path = tmp_path / "nulls.yaml"
    path.write_text(NULLS)
    proc = collector("--simulate", "t4", "--config", str(path), interval="0.2")
    proc.wait_sample(2)
    assert "Traceback" not in proc.log
    # pod_attribution: ~ is the default (on): the collector looks for the kubelet
    assert "no kubelet socket at" in proc.log, proc.log


def test_null_settings_take_their_defaults_in_check(tmp_path):
    path = tmp_path / "nulls.yaml"
    path.write_text(NULLS)
    code, out, err = _run("check", "--simulate", "t4", "--config", str(path),
                          "--kubelet-socket", str(tmp_path / "absent.sock"))
    assert code == 0 and "Traceback" not in err, err
    assert "GPU 1" in out
    assert "no kubelet socket at" in err  # attribution stayed on


# --- generated input ------------------------------------------------------------------------

KEYS = [o.key for o in OPTIONS]
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20), st.dates(),
    st.sampled_from([10**400, -(10**400), 2**64]),
    st.binary(max_size=6),
    st.sampled_from(["10s", "500ms", "1h", "0", "-1", "1e999", "otel,dcgm", "127.0.0.1:0",
                     "[::1]:80", "http://[::1", "true", "", " ", "grpc", "\t", "25h"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)
_documents = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), _values, max_size=6)
_fragments = st.lists(st.sampled_from([
    "interval:", "naming:", "kubelet_resource_names:", "listen:", " ", "\n", "  ", "- ", ": ",
    "[", "]", "{", "}", ",", "&a ", "*a", "&b [*a, *a]", "~", ".inf", ".nan", "-.inf", "10s",
    "!!binary ", "!!python/object:os.system ", "!!set ", "<<: ", "? ", "'", '"', "#", "\t",
    "%YAML 1.1\n", "---\n", "...\n", "\\x00", "\x00", "\ufeff", "é", "0x1F", "1_000",
]), max_size=40).map("".join)

GENERATED = settings(max_examples=250, deadline=None, database=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow])


def _of_type(value: object, kind: object) -> bool:
    if isinstance(kind, types.UnionType):
        return any(_of_type(value, arm) for arm in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if kind is float:
        return isinstance(value, float) and math.isfinite(value)
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return value in typing.get_args(kind)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        args = typing.get_args(kind)
        arms = [args[0]] * len(value) if args[-1:] == (...,) else list(args)
        return (len(arms) == len(value)
                and all(_of_type(v, arm) for v, arm in zip(value, arms, strict=True)))
    return isinstance(value, kind)  # type: ignore[arg-type]


def _expect_load_or_one_line(**kwargs) -> None:
    """``load`` gives every setting a value of its row's type (finite durations), or fails
    with a SetupError of one non-empty line; nothing else."""
    try:
        config = load(**kwargs)
    except SetupError as exc:
        message = str(exc)
        assert message.strip() and "\n" not in message and "\r" not in message, repr(message)
        return
    for option in OPTIONS:
        value = getattr(config, option.key)
        assert _of_type(value, option.type), (option.key, value)


@pytest.mark.slow  # generated input, dozens of examples each: not in the quick loop
@GENERATED
@given(doc=_documents | _values)
def test_generated_documents_load_or_fail_in_one_line(doc):
    text = yaml.safe_dump(doc, allow_unicode=True)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c.yaml"
        path.write_text(text, encoding="utf-8")
        _expect_load_or_one_line(flags={}, environ={}, config_file=str(path))


@GENERATED
@given(data=_fragments.map(str.encode) | st.binary(max_size=200))
def test_generated_yaml_text_and_bytes_load_or_fail_in_one_line(data):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c.yaml"
        path.write_bytes(data)
        _expect_load_or_one_line(flags={}, environ={}, config_file=str(path))


@GENERATED
@given(values=st.dictionaries(st.sampled_from(KEYS), st.text(max_size=40), max_size=5),
       as_flags=st.booleans())
def test_generated_flag_and_variable_values_load_or_fail_in_one_line(values, as_flags):
    if as_flags:
        _expect_load_or_one_line(flags=values, environ={})
    else:
        environ = {f"OTEL_GPU_{key.upper()}": value for key, value in values.items()}
        _expect_load_or_one_line(flags={}, environ=environ)


_flag_text = st.text(alphabet=string.printable.replace("\x0b", "").replace("\x0c", ""),
                     max_size=24)


@pytest.mark.slow  # generated input, dozens of examples each: not in the quick loop
@settings(max_examples=20, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(doc=_documents, interval=_flag_text, listen=_flag_text, naming=_flag_text,
       endpoint=_flag_text)
def test_generated_input_through_the_cli(doc, interval, listen, naming, endpoint):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c.yaml"
        path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
        code, _, err = _run(
            "check", "--simulate", "t4", "--pod-attribution", "false", "--config", str(path),
            f"--interval={interval}", f"--listen={listen}", f"--naming={naming}",
            f"--otlp-endpoint={endpoint}",
        )
    assert "Traceback" not in err, err
    if code == 2:
        _one_error_line(code, err)
    else:
        assert code in (0, 1), err
