"""TLS and basic auth on the scrape endpoint, from an exporter web config file."""

from __future__ import annotations

import base64

import bcrypt
import pytest

from otel_gpu.exporters.webconfig import BasicAuth, WebConfigError, load_web_config
from tests.support.certs import make_certs

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$")


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_auth_checks_and_remembers(monkeypatch):
    auth = BasicAuth({"prometheus": HASH.encode()})
    assert auth.check(_basic("prometheus", "s3cret"))
    assert not auth.check(_basic("prometheus", "wrong"))
    assert not auth.check(_basic("someone", "s3cret"))
    assert not auth.check("Bearer abc") and not auth.check(None)
    assert not auth.check("Basic !!notbase64")
    calls = []
    monkeypatch.setattr(bcrypt, "checkpw", lambda *a: calls.append(a) or True)
    assert auth.check(_basic("prometheus", "s3cret"))
    assert calls == []  # a known-good pair does not pay for bcrypt again
    assert not BasicAuth({})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config: {cert_file: a.crt}\n", "cert_file and key_file are both required"),
        ("tls_server_config: {cert_file: a.crt, key_file: a.key}\n", "cannot load"),
        ("basic_auth_users: {alice: plaintext}\n", "basic_auth_users.alice: expected a bcrypt"),
        ("tls_config: {}\n", "tls_config: unknown key"),
        ("- 1\n", "expected a mapping"),
    ],
)
def test_bad_web_configs_are_one_line(tmp_path, text, message):
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError, match=message) as info:
        load_web_config(str(path))
    assert "\n" not in str(info.value)


def test_mtls_needs_a_client_ca(tmp_path):
    certs = make_certs(tmp_path)
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config: {{cert_file: {certs.server_cert}, "
                    f"key_file: {certs.server_key}, "
                    "client_auth_type: RequireAndVerifyClientCert}\n")
    with pytest.raises(WebConfigError, match="client_ca_file: required"):
        load_web_config(str(path))
