"""TLS and basic auth on the real process's scrape endpoint, from a web config file."""

from __future__ import annotations

import base64
import ssl
import textwrap
import urllib.error
import urllib.request

import bcrypt
import pytest

from tests.support.certs import make_certs
from tests.support.process import run_cli, wait_until

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$")


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _get(url: str, context: ssl.SSLContext | None = None, auth: str | None = None):
    req = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_tls_mtls_and_basic_auth_end_to_end(collector, tmp_path):
    certs = make_certs(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(textwrap.dedent(f"""
        tls_server_config:
          cert_file: {certs.server_cert.name}
          key_file: {certs.server_key.name}
          client_auth_type: RequireAndVerifyClientCert
          client_ca_file: {certs.ca_cert.name}
          min_version: TLS12
        basic_auth_users:
          prometheus: {HASH}
    """))
    proc = collector("--simulate", "t4", "--web-config-file", str(web))
    assert any("serving metrics on https://" in ln for ln in proc.lines)
    base = f"https://localhost:{proc.port}"
    client = ssl.create_default_context(cafile=str(certs.ca_cert))
    client.load_cert_chain(certs.client_cert, certs.client_key)
    assert _get(base + "/healthz", client) == (200, b"ok\n")
    assert _get(base + "/metrics", client)[0] == 401
    assert _get(base + "/metrics", client, _basic("prometheus", "nope"))[0] == 401
    good = _basic("prometheus", "s3cret")
    wait_until(lambda: b"hw_power_watts" in _get(base + "/metrics", client, good)[1],
               what="metrics over TLS with basic auth")
    no_client_cert = ssl.create_default_context(cafile=str(certs.ca_cert))
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _get(base + "/healthz", no_client_cert)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        _get(f"http://127.0.0.1:{proc.port}/healthz")  # plain HTTP is refused
    assert _get(base + "/healthz", client) == (200, b"ok\n")  # still serving


def test_bad_web_config_exits_2(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users: {alice: hunter2}\n")
    code, _, err = run_cli("--simulate", "t4", "--web-config-file", str(path),
                           "--listen", "127.0.0.1:0")
    errors = [ln for ln in err.splitlines() if ln.startswith("otel-gpu: error:")]
    assert code == 2 and errors == [
        f"otel-gpu: error: web config {path}: basic_auth_users.alice: expected a bcrypt hash "
        "($2y$...)"]
