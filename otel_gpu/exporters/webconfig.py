"""TLS and basic auth for the scrape endpoint, from the web config file Prometheus exporters share.

The file has the exporter-toolkit shape node_exporter and dcgm-exporter read,
so an existing one can be reused as it is::

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional mTLS
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      alice: $2y$10$...   # bcrypt hash

Only ``/metrics`` asks for credentials; ``/healthz`` and ``/readyz`` stay open
for the kubelet's probes (they reveal no metric values). TLS covers all three.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from otel_gpu.errors import SetupError


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
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
             "max_version", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites"}


@dataclass(frozen=True)
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    """User name -> bcrypt hash."""


def load_web_config(path: str) -> WebConfig:
    def fail(key: str, what: str) -> WebConfigError:
        return WebConfigError(f"web config {path}: {key}: {what}")

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise WebConfigError(f"web config {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise WebConfigError(
            f"web config {path}: invalid YAML ({exc.__class__.__name__})"
        ) from None
    if not isinstance(doc, dict):
        raise WebConfigError(f"web config {path}: expected a mapping at the top level")
    for key in doc:
        if key not in ("tls_server_config", "basic_auth_users", "http_server_config"):
            raise fail(str(key), "unknown key")
    tls = _tls(doc.get("tls_server_config"), Path(path).parent, fail)
    users: dict[str, bytes] = {}
    for user, hashed in (doc.get("basic_auth_users") or {}).items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise fail(f"basic_auth_users.{user}", "expected a bcrypt hash ($2y$...)")
        users[str(user)] = hashed.encode()
    return WebConfig(tls, users)


def _tls(raw: Any, base: Path, fail) -> ssl.SSLContext | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise fail("tls_server_config", "expected a mapping")
    for key in raw:
        if key not in _TLS_KEYS:
            raise fail(f"tls_server_config.{key}", "unknown key")
    if not raw.get("cert_file") or not raw.get("key_file"):
        raise fail("tls_server_config", "cert_file and key_file are both required")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert, key = base / raw["cert_file"], base / raw["key_file"]
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise fail("tls_server_config.cert_file", f"cannot load {cert} / {key}: {exc}") from None
    auth = raw.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise fail("tls_server_config.client_auth_type",
                   f"expected one of {', '.join(_CLIENT_AUTH)}, got {auth!r}")
    context.verify_mode = _CLIENT_AUTH[auth]
    if context.verify_mode != ssl.CERT_NONE:
        ca = raw.get("client_ca_file")
        if not ca:
            raise fail("tls_server_config.client_ca_file", f"required with {auth}")
        try:
            context.load_verify_locations(base / ca)
        except (OSError, ssl.SSLError) as exc:
            raise fail("tls_server_config.client_ca_file", f"cannot load {ca}: {exc}") from None
    for key, attr in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if key in raw:
            if raw[key] not in _VERSIONS:
                raise fail(f"tls_server_config.{key}",
                           f"expected one of {', '.join(_VERSIONS)}, got {raw[key]!r}")
            setattr(context, attr, _VERSIONS[raw[key]])
    return context


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes.

    bcrypt is slow on purpose (tens of milliseconds); a scraper sends the
    same credentials every time, so a successful check is remembered (as a
    salted digest, never the password) and costs nothing the next time.
    """

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._salt = hashlib.sha256(repr(sorted(self._users.items())).encode()).digest()
        self._good: set[bytes] = set()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._users)

    def check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        if hashed is None:
            return False
        digest = hmac.new(self._salt, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        with self._lock:
            if digest in self._good:
                return True
        import bcrypt

        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            if len(self._good) > 64:
                self._good.clear()
            self._good.add(digest)
        return True
