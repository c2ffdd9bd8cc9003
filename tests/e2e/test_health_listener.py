"""The plain health listener (``health_listen``) on the real process, with mutual TLS on.

The kubelet's HTTP probes carry no client certificate; with
``client_auth_type: RequireAndVerifyClientCert`` they cannot pass the main
endpoint's handshake, so they ask the health listener instead.
"""

from __future__ import annotations

import re
import socket
import ssl
import textwrap
import urllib.error
import urllib.request

import pytest

from testkit.process import http_get, run_cli, wait_until
from tests.support.certs import make_certs

_HEALTH = re.compile(r"serving health checks on http://(\S+):(\d+)/healthz and /readyz")


def _health_port(proc) -> int:
    def found():
        for line in proc.lines:
            match = _HEALTH.search(line)
            if match:
                return int(match.group(2))
        return None

    return wait_until(found, what="the health listener's log line")


def _https(url: str, context: ssl.SSLContext):
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _mtls_web_config(tmp_path):
    certs = make_certs(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(textwrap.dedent(f"""
        tls_server_config:
          cert_file: {certs.server_cert.name}
          key_file: {certs.server_key.name}
          client_auth_type: RequireAndVerifyClientCert
          client_ca_file: {certs.ca_cert.name}
    """))
    return certs, web


def test_probes_reach_health_without_a_client_certificate_under_mtls(collector, tmp_path):
    certs, web = _mtls_web_config(tmp_path)
    proc = collector("--simulate", "t4", "--web-config-file", str(web),
                     "--health-listen", "127.0.0.1:0")
    health = f"http://127.0.0.1:{_health_port(proc)}"

    # what a kubelet probe does: plain HTTP, no certificate
    assert http_get(health + "/healthz")[::2] == (200, b"ok\n")
    wait_until(lambda: http_get(health + "/readyz")[0] == 200, what="/readyz 200")
    assert http_get(health + "/metrics")[0] == 404  # health only: no metrics in the clear

    main = f"https://localhost:{proc.port}"
    without_cert = ssl.create_default_context(cafile=str(certs.ca_cert))
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _https(main + "/metrics", without_cert)
    with_cert = ssl.create_default_context(cafile=str(certs.ca_cert))
    with_cert.load_cert_chain(certs.client_cert, certs.client_key)
    status, body = _https(main + "/metrics", with_cert)
    assert status == 200 and b"hw_power_watts" in body


def test_without_the_setting_there_is_no_health_listener(collector):
    proc = collector("--simulate", "t4")
    assert proc.get("/healthz")[0] == 200
    assert not any("serving health checks" in line for line in proc.lines)


def test_a_health_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run_cli("--simulate", "t4", "--listen", "127.0.0.1:0",
                               "--health-listen", f"127.0.0.1:{port}", timeout=30)
    errors = [line for line in err.splitlines() if line.startswith("otel-gpu: error:")]
    assert code == 2 and len(errors) == 1, err
    assert errors[0].startswith(f"otel-gpu: error: health_listen 127.0.0.1:{port}: "), err
    assert "Traceback" not in err


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_ipv6_addresses_print_in_brackets(collector):
    proc = collector("--simulate", "t4", "--listen", "[::1]:0", "--health-listen", "[::1]:0")
    serving = [line for line in proc.lines if "serving metrics on" in line]
    assert f"serving metrics on http://[::1]:{proc.port}/metrics " in serving[0], serving
    health_port = _health_port(proc)
    assert any(f"http://[::1]:{health_port}/healthz" in line for line in proc.lines)
    # and the printed URL is one a client can use as it is
    assert http_get(f"http://[::1]:{proc.port}/healthz")[0] == 200
    assert http_get(f"http://[::1]:{health_port}/readyz")[0] in (200, 503)
