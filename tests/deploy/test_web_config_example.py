"""examples/web-config.yml works as its comment says: scripts/make-test-certs.sh makes the
files it names, otel-gpu serves with the copy beside them, and the example's curl (CA,
client certificate, password) scrapes /metrics while each credential left out fails."""

from __future__ import annotations

import base64
import http.client
import re
import shutil
import socket
import ssl
import subprocess

import pytest
import yaml

from testkit.process import CollectorProcess, serve_args, wait_until
from tests.deploy.helpers import ROOT, tool

SCRIPT = ROOT / "scripts" / "make-test-certs.sh"
EXAMPLE = ROOT / "examples" / "web-config.yml"
PASSWORD = "example-only-change-me"  # the example's hash is this one's


def _make(directory, *names: str) -> subprocess.CompletedProcess:
    tool("openssl", "Debian: apt-get install openssl")
    return subprocess.run([str(SCRIPT), str(directory), *names], capture_output=True,
                          text=True, timeout=60)


def test_the_script_makes_every_file_the_example_names(tmp_path):
    proc = _make(tmp_path / "tls")
    assert proc.returncode == 0, proc.stderr
    tls = yaml.safe_load(EXAMPLE.read_text())["tls_server_config"]
    for key in ("cert_file", "key_file", "client_ca_file"):
        assert (tmp_path / "tls" / tls[key]).is_file(), key
    for name in ("ca.key", "server.key", "client.key"):
        assert (tmp_path / "tls" / name).stat().st_mode & 0o077 == 0, name
    # the certificates verify against the CA under OpenSSL's strict checks
    openssl = tool("openssl", "Debian: apt-get install openssl")
    check = subprocess.run([openssl, "verify", "-x509_strict", "-CAfile", "ca.crt",
                            "server.crt", "client.crt"], cwd=tmp_path / "tls",
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_script_takes_server_names_and_refuses_a_bad_one(tmp_path):
    proc = _make(tmp_path / "tls", "otel-gpu.monitoring.svc", "10.0.0.7")
    assert proc.returncode == 0, proc.stderr
    openssl = tool("openssl", "Debian: apt-get install openssl")
    text = subprocess.run([openssl, "x509", "-noout", "-ext", "subjectAltName", "-in",
                           str(tmp_path / "tls" / "server.crt")], capture_output=True,
                          text=True, timeout=30).stdout
    assert "DNS:otel-gpu.monitoring.svc" in text and "IP Address:10.0.0.7" in text
    proc = _make(tmp_path / "bad", "not a name")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "make-test-certs: not a name is neither a DNS name nor an IP address"]
    assert _make("").returncode == 2


def _get(port: int, tls_dir, *, client_cert=True, password=True):
    context = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    if client_cert:
        context.load_cert_chain(tls_dir / "client.crt", tls_dir / "client.key")
    headers = {}
    if password:
        headers["Authorization"] = "Basic " + base64.b64encode(
            f"prometheus:{PASSWORD}".encode()).decode()
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = http.client.HTTPSConnection("localhost", port, timeout=10)
    conn.sock = context.wrap_socket(raw, server_hostname="localhost")
    try:
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_otel_gpu_serves_the_example_with_the_scripts_certificates(tmp_path):
    tls_dir = tmp_path / "tls"
    proc = _make(tls_dir)
    assert proc.returncode == 0, proc.stderr
    shutil.copy(EXAMPLE, tls_dir / "web-config.yml")
    # the comment's curl names these files and this password
    comment = EXAMPLE.read_text()
    assert re.search(r"curl --cacert \S+/ca\.crt --cert \S+/client\.crt", comment)
    assert f"-u prometheus:{PASSWORD}" in comment
    collector = CollectorProcess(serve_args(
        "--simulate", "t4", "--web-config-file", str(tls_dir / "web-config.yml"),
        "--kubelet-socket", str(tmp_path / "no-kubelet.sock")))
    try:
        port = collector.wait_serving()

        def scraped():
            status, body = _get(port, tls_dir)
            return body if status == 200 else None

        body = wait_until(scraped, what="a scrape with the example's credentials")
        assert "hw_status" in body
        assert _get(port, tls_dir, password=False)[0] == 401
        with pytest.raises((OSError, http.client.HTTPException)):
            _get(port, tls_dir, client_cert=False)
    finally:
        collector.stop()
