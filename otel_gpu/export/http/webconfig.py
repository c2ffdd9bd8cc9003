"""TLS and basic auth for the scrape endpoint, from the web config file Prometheus exporters share.

The file has the exporter-toolkit shape node_exporter and dcgm-exporter read,
so an existing one can be reused as it is::

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional mTLS
      client_ca_file: ca.crt
      min_version: TLS12
      max_version: TLS13
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # TLS 1.2 and below
      prefer_server_cipher_suites: true
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000
    basic_auth_users:
      alice: $2y$10$...   # bcrypt hash

Every key is checked at start-up: a wrong type, an unknown name or a bcrypt
hash that could never match stops the collector with one line naming the
file and the key. Two options of the format are refused rather than ignored:
``curve_preferences`` (Python's ssl module cannot set a list of curves) and
``http2: true`` (otel-gpu serves HTTP/1.1 only).

Only ``/metrics`` asks for credentials; ``/healthz`` and ``/readyz`` stay open
for the kubelet's probes (they reveal no metric values). TLS covers all three.
"""

from __future__ import annotations

import logging
import re
import ssl
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from otel_gpu._files import FileError, load_yaml, read_bytes
from otel_gpu.errors import SetupError

log = logging.getLogger(__name__)


class WebConfigError(SetupError):
    """A bad web config file; ``str()`` is one line naming the file and key."""


_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
             "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users")
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
             "max_version", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites")
_HTTP_KEYS = ("headers", "http2")

# The format's cipher suite names (Go's, for TLS 1.2 and below) and OpenSSL's names for them.
_CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
}
_TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                 "TLS_CHACHA20_POLY1305_SHA256")

# Security headers the format allows in http_server_config.headers, with the values
# a header accepts when only some make sense (None: any value).
_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}

# A bcrypt hash: $2a$, $2b$, $2x$ or $2y$, a two-digit cost, a 22-character salt
# whose last character carries 4 bits and a 31-character digest whose last
# character carries 4 bits. Any other shape never matches a password (or makes
# the bcrypt library raise on every check).
_BCRYPT = re.compile(
    r"\$2[abxy]\$(?P<cost>\d\d)\$[./A-Za-z0-9]{21}[.Oeu][./A-Za-z0-9]{30}[.CGKOSWaeimquy26]"
)
MIN_BCRYPT_COST = 4
MAX_BCRYPT_COST = 16
"""Cost 16 is 65,536 rounds: several seconds per check. Higher would hold the
one bcrypt slot (see :class:`BasicAuth`) for minutes per request."""


@dataclass(frozen=True)
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    """User name -> bcrypt hash."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra response headers (``http_server_config.headers``)."""


Fail = Callable[[str, str], NoReturn]
"""Reports one bad key of the file (it raises)."""


def load_web_config(path: str) -> WebConfig:
    def fail(key: str, what: str) -> NoReturn:
        raise WebConfigError(f"web config {path}: {key}: {what}")

    try:
        doc = load_yaml(path, "web config")
    except FileError as exc:
        raise WebConfigError(str(exc)) from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise WebConfigError(
            f"web config {path}: expected a mapping at the top level, got {_kind(doc)}")
    _known_keys(doc, "", _TOP_KEYS, fail)
    base = Path(path).parent
    tls = _tls(_section(doc, "tls_server_config", fail), base, fail)
    headers = _http(_section(doc, "http_server_config", fail), fail)
    users = _users(_section(doc, "basic_auth_users", fail), fail)
    return WebConfig(tls, users, headers)


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value!r})" if len(value) <= 40 else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _section(doc: dict[str, Any], key: str, fail: Fail) -> dict[str, Any] | None:
    raw = doc.get(key)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        fail(key, f"expected a mapping, got {_kind(raw)}")
    return raw


def _known_keys(raw: dict[str, Any], prefix: str, known: tuple[str, ...], fail: Fail) -> None:
    for key in raw:
        if not isinstance(key, str) or key not in known:
            fail(f"{prefix}{key}", f"unknown key (expected one of {', '.join(known)})")


def _string(raw: dict[str, Any], key: str, prefix: str, fail: Fail,
            what: str = "a string") -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        fail(f"{prefix}{key}", f"expected {what}, got {_kind(value)}")
    return value


def _choice(raw: dict[str, Any], key: str, prefix: str, choices: Mapping[str, Any],
            fail: Fail) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or value not in choices:
        fail(f"{prefix}{key}", f"expected one of {', '.join(choices)}, got {_kind(value)}")
    return value


def _regular_file(path: Path, key: str, fail: Fail) -> None:
    """Refuse what ssl would hang on or read without bound (a FIFO, /dev/zero)."""
    try:
        read_bytes(str(path), key)
    except FileError as exc:
        fail(key, str(exc).removeprefix(f"{key} "))


def _tls(raw: dict[str, Any] | None, base: Path, fail: Fail) -> ssl.SSLContext | None:
    if raw is None:
        return None
    p = "tls_server_config."
    _known_keys(raw, p, _TLS_KEYS, fail)
    cert_name = _string(raw, "cert_file", p, fail, "a file name")
    key_name = _string(raw, "key_file", p, fail, "a file name")
    if not cert_name or not key_name:
        fail("tls_server_config", "cert_file and key_file are both required")
    if raw.get("curve_preferences") is not None:
        fail(p + "curve_preferences",
             "not supported by otel-gpu (Python's ssl module cannot set a list of curves); "
             "remove it to use OpenSSL's defaults")
    cert, key = base / cert_name, base / key_name
    _regular_file(cert, p + "cert_file", fail)
    _regular_file(key, p + "key_file", fail)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.options |= ssl.OP_NO_RENEGOTIATION
    encrypted = []

    def no_password() -> bytes:
        encrypted.append(True)
        return b""

    try:
        context.load_cert_chain(cert, key, password=no_password)
    except (OSError, ssl.SSLError) as exc:
        if encrypted:
            fail(p + "key_file", f"{key} is encrypted; otel-gpu needs an unencrypted key")
        fail(p + "cert_file", f"cannot load {cert} / {key}: {exc}")
    _warn_if_world_writable(key, p + "key_file")

    auth = _choice(raw, "client_auth_type", p, _CLIENT_AUTH, fail) or "NoClientCert"
    context.verify_mode = _CLIENT_AUTH[auth]
    ca_name = _string(raw, "client_ca_file", p, fail, "a file name")
    if context.verify_mode != ssl.CERT_NONE and not ca_name:
        fail(p + "client_ca_file", f"required with {auth}")
    if ca_name:
        ca = base / ca_name
        _regular_file(ca, p + "client_ca_file", fail)
        try:
            context.load_verify_locations(ca)
        except (OSError, ssl.SSLError) as exc:
            fail(p + "client_ca_file", f"cannot load {ca}: {exc}")

    low = _choice(raw, "min_version", p, _VERSIONS, fail)
    high = _choice(raw, "max_version", p, _VERSIONS, fail)
    if low and high and _VERSIONS[low] > _VERSIONS[high]:
        fail(p + "min_version", f"{low} is above max_version {high}")
    if low:
        context.minimum_version = _VERSIONS[low]
    if high:
        context.maximum_version = _VERSIONS[high]

    suites = raw.get("cipher_suites")
    if suites is not None:
        context.set_ciphers(_ciphers(suites, fail))
    prefer = raw.get("prefer_server_cipher_suites")
    if prefer is not None:
        if not isinstance(prefer, bool):
            fail(p + "prefer_server_cipher_suites", f"expected true or false, got {_kind(prefer)}")
        if prefer:
            context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        else:
            context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


def _ciphers(suites: Any, fail: Fail) -> str:
    key = "tls_server_config.cipher_suites"
    if not isinstance(suites, list) or not all(isinstance(s, str) for s in suites):
        fail(key, f"expected a list of cipher suite names, got {_kind(suites)}")
    if not suites:
        fail(key, "the list is empty; remove the key to use the defaults")
    names = []
    for suite in suites:
        if suite in _TLS13_SUITES:
            fail(key, f"{suite} is a TLS 1.3 suite, which cannot be chosen; list TLS 1.2 "
                      "suites only")
        if suite not in _CIPHER_SUITES:
            fail(key, f"unknown cipher suite {suite!r} (for example "
                      "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
        names.append(_CIPHER_SUITES[suite])
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        probe.set_ciphers(":".join(names))
    except ssl.SSLError:
        fail(key, "none of these suites is available in this OpenSSL")
    return ":".join(names)


def _warn_if_world_writable(path: Path, key: str) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & stat.S_IWOTH:
        log.warning("web config: %s %s is world-writable: anyone on this host can replace "
                    "the server's private key (chmod o-w %s)", key, path, path)


def _http(raw: dict[str, Any] | None, fail: Fail) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    p = "http_server_config."
    _known_keys(raw, p, _HTTP_KEYS, fail)
    http2 = raw.get("http2")
    if http2 is not None:
        if not isinstance(http2, bool):
            fail(p + "http2", f"expected true or false, got {_kind(http2)}")
        if http2:
            fail(p + "http2", "not supported: otel-gpu serves HTTP/1.1 only; set it to false "
                              "or remove it")
    headers = raw.get("headers")
    if headers is None:
        return ()
    if not isinstance(headers, dict):
        fail(p + "headers", f"expected a mapping of header names to values, got {_kind(headers)}")
    canonical = {name.lower(): name for name in _HEADERS}
    out = []
    for name, value in headers.items():
        known = canonical.get(name.lower()) if isinstance(name, str) else None
        if known is None:
            fail(f"{p}headers.{name}", f"not allowed (allowed: {', '.join(_HEADERS)})")
        if not isinstance(value, str) or not value.strip():
            fail(f"{p}headers.{name}", f"expected a string, got {_kind(value)}")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value) or not value.isascii():
            fail(f"{p}headers.{name}", "control or non-ASCII characters are not allowed")
        allowed = _HEADERS[known]
        if allowed is not None and value.lower() not in allowed:
            fail(f"{p}headers.{name}", f"expected one of {', '.join(allowed)}, got {value!r}")
        out.append((known, value))
    return tuple(out)


def _users(raw: dict[str, Any] | None, fail: Fail) -> dict[str, bytes]:
    if raw is None:
        return {}
    users: dict[str, bytes] = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user:
            fail(f"basic_auth_users.{user}", "a user name must be a non-empty string (quote it)")
        key = f"basic_auth_users.{user}"
        if ":" in user or any(ord(c) < 0x20 for c in user):
            fail(key, "a user name cannot contain ':' or control characters")
        if not isinstance(hashed, str):
            fail(key, f"expected a bcrypt hash ($2y$...), got {_kind(hashed)}")
        if not hashed.startswith(("$2a$", "$2b$", "$2x$", "$2y$")):
            fail(key, "expected a bcrypt hash ($2y$...)")
        match = _BCRYPT.fullmatch(hashed)
        if match is None:
            fail(key, "not a valid bcrypt hash (expected $2y$, a two-digit cost, $ and 53 "
                      "characters, as htpasswd -nB or bcrypt.hashpw write it)")
        cost = int(match["cost"])
        if not MIN_BCRYPT_COST <= cost <= MAX_BCRYPT_COST:
            fail(key, f"bcrypt cost {cost} is outside {MIN_BCRYPT_COST}..{MAX_BCRYPT_COST} "
                      "(10 to 12 is usual)")
        users[user] = hashed.encode()
    return users

