"""TLS and basic auth on the real process's scrape endpoint, from a web config file."""

from __future__ import annotations

import base64
import os
import re
import shutil
import ssl
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from testkit.process import run_cli, wait_until
from tests.support.certs import make_certs

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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("basic_auth_users: {alice: $2y$10$garbage}\n",
         "basic_auth_users.alice: not a valid bcrypt hash"),
        ("basic_auth_users: [alice]\n", "basic_auth_users: expected a mapping, got a list"),
        ("tls_server_config: {cert_file: 123, key_file: k}\n",
         "tls_server_config.cert_file: expected a file name, got a number"),
        ("tls_server_config: {cert_file: CERT, key_file: KEY, client_auth_type: [a]}\n",
         "tls_server_config.client_auth_type: expected one of"),
        ("tls_server_config: {cert_file: CERT, key_file: KEY, min_version: [TLS12]}\n",
         "tls_server_config.min_version: expected one of"),
        ("tls_server_config: {cert_file: CERT, key_file: KEY, curve_preferences: [X25519]}\n",
         "tls_server_config.curve_preferences: not supported by otel-gpu"),
        (b"basic_auth_users: {caf\xe9: x}\n", "not UTF-8 text"),
        ("FIFO", "not a regular file (a FIFO)"),
        ("/dev/zero", "not a regular file (a character device)"),
    ],
    ids=["bad-hash", "users-list", "cert-number", "client-auth-list", "min-version-list",
         "curves", "latin1", "fifo", "dev-zero"],
)
def test_every_bad_web_config_exits_2_with_one_line(tmp_path, text, message):
    certs = make_certs(tmp_path)
    path = tmp_path / "web.yml"
    if text == "FIFO":
        os.mkfifo(path)
    elif text == "/dev/zero":
        path = Path(text)
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text.replace("CERT", str(certs.server_cert))
                        .replace("KEY", str(certs.server_key)))
    code, _, err = run_cli("--simulate", "t4", "--web-config-file", str(path),
                           "--listen", "127.0.0.1:0", timeout=20)
    lines = err.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("otel-gpu: error:")]
    assert code == 2 and len(errors) == 1, err
    assert errors[0].startswith(f"otel-gpu: error: web config {path}: ") and message in errors[0]
    assert "Traceback" not in err


def test_security_headers_and_the_example_password(collector, tmp_path):
    """The example file, with certificates beside it, serves with its documented password and
    its Strict-Transport-Security header."""
    example = Path(__file__).resolve().parents[2] / "examples" / "web-config.yml"
    text = example.read_text()
    password = re.search(r'example password "([^"]+)"', text).group(1)
    certs = make_certs(tmp_path)
    for name, source in (("server.crt", certs.server_cert), ("server.key", certs.server_key),
                         ("ca.crt", certs.ca_cert)):
        shutil.copy(source, tmp_path / name)
    shutil.copy(example, tmp_path / "web-config.yml")
    proc = collector("--simulate", "t4", "--web-config-file", str(tmp_path / "web-config.yml"))
    client = ssl.create_default_context(cafile=str(certs.ca_cert))
    client.load_cert_chain(certs.client_cert, certs.client_key)
    auth = _basic("prometheus", password)
    # /metrics is 503 until the first sample is published
    wait_until(lambda: _get(f"https://localhost:{proc.port}/metrics", client, auth)[0] == 200,
               what="the first sample")
    req = urllib.request.Request(f"https://localhost:{proc.port}/metrics",
                                 headers={"Authorization": _basic("prometheus", password)})
    with urllib.request.urlopen(req, timeout=10, context=client) as resp:
        assert resp.status == 200
        assert resp.headers["Strict-Transport-Security"] == "max-age=31536000"
