"""TLS and basic auth on the scrape endpoint, from an exporter web config file."""

from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import ssl
import threading
from pathlib import Path

import bcrypt
import pytest

from otel_gpu.export.http.basic_auth import AuthBusy, BasicAuth
from otel_gpu.export.http.webconfig import WebConfigError, load_web_config
from testkit.process import wait_until
from tests.support.certs import make_certs

HASH = "$2y$04$M2UWofadSVoe.odNCgCnAObPhE4MtJTbiEpAgWqtCnY1Ez/Zh5dD."
"""bcrypt of s3cret at cost 4, fixed: test ids built from it must be the same in every process."""
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "web-config.yml"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _load(tmp_path, text: str):
    path = tmp_path / "web.yml"
    path.write_text(text)
    return load_web_config(str(path))


def _tls_lines(certs) -> str:
    return (f"tls_server_config:\n  cert_file: {certs.server_cert}\n"
            f"  key_file: {certs.server_key}\n")


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


def test_remembered_credentials_expire_and_stay_bounded(monkeypatch, clock):
    auth = BasicAuth({"prometheus": HASH.encode()}, cache_ttl=60.0, cache_size=2, clock=clock)
    real = bcrypt.checkpw
    calls = []
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: calls.append(pw) or real(pw, h))
    assert auth.check(_basic("prometheus", "s3cret")) and len(calls) == 1
    clock.advance(59)
    assert auth.check(_basic("prometheus", "s3cret")) and len(calls) == 1
    clock.advance(2)
    assert auth.check(_basic("prometheus", "s3cret")) and len(calls) == 2  # expired: checked again
    assert len(auth._good) == 1


def test_an_unknown_user_costs_a_bcrypt_check_like_a_known_one(monkeypatch):
    """No username oracle: both refusals run bcrypt at the configured cost."""
    slow = bcrypt.hashpw(b"other", bcrypt.gensalt(6))
    auth = BasicAuth({"fast": HASH.encode(), "slow": slow})
    seen = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: seen.append(h) or real(pw, h))
    assert not auth.check(_basic("nobody", "guess"))
    assert not auth.check(_basic("fast", "guess"))
    assert seen == [slow, HASH.encode()]  # the unknown user paid the costliest user's check


@pytest.mark.parametrize("user", ["prometheus", "nobody"])
def test_a_password_over_72_bytes_is_wrong_not_an_error(user):
    auth = BasicAuth({"prometheus": HASH.encode()})
    assert auth.check(_basic(user, "s3cret" + "x" * 100)) is False


def test_bcrypt_work_is_bounded_and_excess_waiters_are_busy(monkeypatch):
    """A flood of wrong passwords runs one bcrypt at a time; who waits too long gets AuthBusy."""
    inside = threading.Semaphore(0)
    release = threading.Event()
    running = [0, 0]  # now, most at once
    lock = threading.Lock()

    def blocking_checkpw(_pw, _h):
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        inside.release()
        release.wait(10)
        with lock:
            running[0] -= 1
        return False

    monkeypatch.setattr(bcrypt, "checkpw", blocking_checkpw)
    auth = BasicAuth({"prometheus": HASH.encode()}, max_concurrent=1, wait=0.05)
    results: list[object] = []

    def guess():
        try:
            results.append(auth.check(_basic("prometheus", "guess")))
        except AuthBusy:
            results.append("busy")

    first = threading.Thread(target=guess)
    first.start()
    assert inside.acquire(timeout=10)
    others = [threading.Thread(target=guess) for _ in range(4)]
    for t in others:
        t.start()
    for t in others:
        t.join(10)
    assert results == ["busy"] * 4
    release.set()
    first.join(10)
    assert results[-1] is False and running[1] == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config: {cert_file: a.crt}\n", "cert_file and key_file are both required"),
        ("tls_server_config: {cert_file: a.crt, key_file: a.key}\n",
         r"cert_file: .*a\.crt: cannot read it \(No such file"),
        ("basic_auth_users: {alice: plaintext}\n", "basic_auth_users.alice: expected a bcrypt"),
        ("tls_config: {}\n", "tls_config: unknown key"),
        ("- 1\n", "expected a mapping at the top level, got a list"),
        # wrong types: one line, never a TypeError
        ("basic_auth_users: [alice]\n", "basic_auth_users: expected a mapping, got a list"),
        ("basic_auth_users: {alice: 123}\n", r"basic_auth_users.alice: expected a bcrypt hash "
                                             r"\(\$2y\$...\), got a number"),
        ("basic_auth_users: {123: x}\n", "basic_auth_users.123: a user name must be"),
        ("basic_auth_users: {'a:b': x}\n", "cannot contain ':'"),
        ("tls_server_config: {cert_file: 123, key_file: a.key}\n",
         "tls_server_config.cert_file: expected a file name, got a number"),
        ("tls_server_config: [a]\n", "tls_server_config: expected a mapping, got a list"),
        ("http_server_config: 1\n", "http_server_config: expected a mapping, got a number"),
        # malformed bcrypt hashes are refused at start-up, not on every request
        ("basic_auth_users: {alice: $2y$10$garbage}\n", "alice: not a valid bcrypt hash"),
        ("basic_auth_users: {alice: $2y$}\n", "alice: not a valid bcrypt hash"),
        ("basic_auth_users: {alice: '" + HASH[:-1] + "'}\n", "alice: not a valid bcrypt hash"),
        ("basic_auth_users: {alice: '" + HASH[:28] + "z" + HASH[29:] + "'}\n",
         "alice: not a valid bcrypt hash"),
        ("basic_auth_users: {alice: '" + HASH.replace("$04$", "$31$") + "'}\n",
         "bcrypt cost 31 is outside 4..16"),
        ("basic_auth_users: {alice: '" + HASH.replace("$04$", "$03$") + "'}\n",
         "bcrypt cost 3 is outside"),
        # options of the format are implemented or refused, never ignored
        ("http_server_config: {http2: true}\n", "http2: not supported: otel-gpu serves HTTP/1.1"),
        ("http_server_config: {http2: yes please}\n", "http2: expected true or false"),
        ("http_server_config: {headers: {X-Powered-By: me}}\n",
         "headers.X-Powered-By: not allowed"),
        ("http_server_config: {headers: {X-Frame-Options: allow}}\n",
         "X-Frame-Options: expected one of deny, sameorigin"),
        ("http_server_config: {headers: {X-XSS-Protection: [1]}}\n", "expected a string"),
        ("http_server_config: {headers: {X-XSS-Protection: \"1\\r\\nSet-Cookie: a\"}}\n",
         "control or non-ASCII characters"),
        ("http_server_config: {timeouts: 1}\n", "http_server_config.timeouts: unknown key"),
        # the file itself: bounded, UTF-8, plain YAML
        ("a: &x 1\nb: *x\n", r"aliases \(\*x\) are not allowed"),
        ("basic_auth_users: {alice: x}\nbasic_auth_users: {}\n", "duplicate key"),
    ],
)
def test_bad_web_configs_are_one_line(tmp_path, text, message):
    with pytest.raises(WebConfigError, match=message) as info:
        _load(tmp_path, text)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"web config {tmp_path / 'web.yml'}: ")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("  client_auth_type: [a]\n", "client_auth_type: expected one of NoClientCert, "
                                      ".*, got a list"),
        ("  client_auth_type: Always\n", "client_auth_type: expected one of .*'Always'"),
        ("  min_version: [TLS12]\n", "min_version: expected one of TLS10, TLS11, TLS12, TLS13, "
                                     "got a list"),
        ("  max_version: 1.2\n", "max_version: expected one of .*got a number"),
        ("  min_version: TLS13\n  max_version: TLS12\n", "TLS13 is above max_version TLS12"),
        ("  client_ca_file: {a: 1}\n", "client_ca_file: expected a file name, got a mapping"),
        ("  curve_preferences: [X25519]\n", "curve_preferences: not supported by otel-gpu"),
        ("  cipher_suites: TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\n",
         "cipher_suites: expected a list of cipher suite names, got a string"),
        ("  cipher_suites: [TLS_NOPE]\n", "unknown cipher suite 'TLS_NOPE'"),
        ("  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "is a TLS 1.3 suite"),
        ("  prefer_server_cipher_suites: 1\n", "prefer_server_cipher_suites: expected true or"),
        ("  client_allowed_sans: [a]\n", "client_allowed_sans: unknown key"),
    ],
)
def test_bad_tls_settings_are_one_line(tmp_path, extra, message):
    certs = make_certs(tmp_path)
    with pytest.raises(WebConfigError, match=message) as info:
        _load(tmp_path, _tls_lines(certs) + extra)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind", ["fifo", "zero", "latin1"])
def test_unreadable_files_are_one_line(tmp_path, kind):
    path = tmp_path / "web.yml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "latin1":
        path.write_bytes(b"basic_auth_users: {caf\xe9: x}\n")
    else:
        path = Path("/dev/zero")
    with pytest.raises(WebConfigError) as info:
        load_web_config(str(path))
    text = str(info.value)
    assert text.startswith(f"web config {path}: ") and "\n" not in text
    assert {"fifo": "a FIFO", "zero": "not a regular file", "latin1": "not UTF-8"}[kind] in text


def test_a_fifo_as_the_key_file_is_refused(tmp_path):
    certs = make_certs(tmp_path)
    os.mkfifo(tmp_path / "fifo.key")
    with pytest.raises(WebConfigError, match="key_file: .*fifo.key: not a regular file"):
        _load(tmp_path, f"tls_server_config: {{cert_file: {certs.server_cert}, "
                        f"key_file: fifo.key}}\n")


def test_tls_options_are_applied(tmp_path):
    certs = make_certs(tmp_path)
    web = _load(tmp_path, _tls_lines(certs) + (
        "  min_version: TLS12\n  max_version: TLS12\n"
        "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n"
        "  prefer_server_cipher_suites: false\n"
        "http_server_config:\n  http2: false\n  headers:\n"
        "    strict-transport-security: max-age=31536000\n    X-Frame-Options: DENY\n"))
    tls = web.tls
    assert tls.minimum_version == tls.maximum_version == ssl.TLSVersion.TLSv1_2
    assert not tls.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    assert tls.options & ssl.OP_NO_RENEGOTIATION
    tls12 = {c["name"] for c in tls.get_ciphers() if c["protocol"] != "TLSv1.3"}
    assert tls12 == {"ECDHE-ECDSA-AES256-GCM-SHA384"}
    assert web.headers == (("Strict-Transport-Security", "max-age=31536000"),
                           ("X-Frame-Options", "DENY"))


def test_a_world_writable_key_gets_a_warning(tmp_path, caplog):
    certs = make_certs(tmp_path)
    text = _tls_lines(certs)
    with caplog.at_level(logging.WARNING, logger="otel_gpu"):
        _load(tmp_path, text)
    assert not caplog.records
    certs.server_key.chmod(0o666)
    with caplog.at_level(logging.WARNING, logger="otel_gpu"):
        _load(tmp_path, text)
    assert [r.getMessage() for r in caplog.records] == [
        f"web config: tls_server_config.key_file {certs.server_key} is world-writable: anyone "
        f"on this host can replace the server's private key (chmod o-w {certs.server_key})"]


def test_mtls_needs_a_client_ca(tmp_path):
    certs = make_certs(tmp_path)
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config: {{cert_file: {certs.server_cert}, "
                    f"key_file: {certs.server_key}, "
                    "client_auth_type: RequireAndVerifyClientCert}\n")
    with pytest.raises(WebConfigError, match="client_ca_file: required"):
        load_web_config(str(path))


def test_the_example_web_config_loads_and_its_documented_password_works(tmp_path):
    text = EXAMPLE.read_text()
    password = re.search(r'example password "([^"]+)"', text).group(1)
    certs = make_certs(tmp_path)
    for name, source in (("server.crt", certs.server_cert), ("server.key", certs.server_key),
                         ("ca.crt", certs.ca_cert)):
        shutil.copy(source, tmp_path / name)
    shutil.copy(EXAMPLE, tmp_path / "web-config.yml")
    web = load_web_config(str(tmp_path / "web-config.yml"))
    assert web.tls is not None and web.tls.verify_mode == ssl.CERT_REQUIRED
    auth = BasicAuth(web.users)
    assert auth.check(_basic("prometheus", password))
    assert not auth.check(_basic("prometheus", password + "x"))


def test_a_blocked_check_does_not_block_remembered_credentials(monkeypatch):
    """Scrapes with good, remembered credentials pass while bcrypt is taken by a guesser."""
    auth = BasicAuth({"prometheus": HASH.encode()}, max_concurrent=1, wait=0.05)
    assert auth.check(_basic("prometheus", "s3cret"))
    release = threading.Event()
    started = threading.Event()

    def stuck(_pw, _h):
        started.set()
        release.wait(10)
        return False

    monkeypatch.setattr(bcrypt, "checkpw", stuck)
    guesser = threading.Thread(target=auth.check, args=(_basic("prometheus", "guess"),))
    guesser.start()
    wait_until(started.is_set, 10, "the guesser's bcrypt check")
    assert auth.check(_basic("prometheus", "s3cret"))
    with pytest.raises(AuthBusy):
        auth.check(_basic("prometheus", "another guess"))
    release.set()
    guesser.join(10)


def test_a_miss_costs_the_costliest_hash_whoever_the_user(monkeypatch):
    """Once a user with a cost-4 hash answered a wrong password in 1 ms where an unknown
    user took 51 ms: users were told apart by timing."""
    import bcrypt

    cheap = bcrypt.hashpw(b"right", bcrypt.gensalt(4))
    costly = bcrypt.hashpw(b"right", bcrypt.gensalt(8))
    checked: list[bytes] = []
    original = bcrypt.checkpw

    def counted(password, hashed):
        checked.append(hashed)
        return original(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    slept: list[float] = []
    auth = BasicAuth({"cheap": cheap, "costly": costly}, sleep=slept.append)

    def basic(user, password):
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    # Nothing measured yet: the cheap miss pays a check against the costliest hash for real.
    assert not auth.check(basic("cheap", "wrong"))
    assert checked == [cheap, costly] and slept == []
    costliest = auth._costliest_s
    assert costliest is not None and costliest > 0
    # From then on the rest of the costliest check's time is waited out, off the bcrypt slots.
    checked.clear()
    assert not auth.check(basic("cheap", "wrong"))
    assert checked == [cheap]
    (wait,) = slept
    assert 0 < wait <= costliest
    # An unknown user and the costliest user's miss are one check of that hash, no wait.
    checked.clear()
    assert not auth.check(basic("nobody", "wrong")) and not auth.check(basic("costly", "x"))
    assert checked == [costly, costly] and len(slept) == 1
    # A right password is never delayed.
    assert auth.check(basic("cheap", "right")) and len(slept) == 1
