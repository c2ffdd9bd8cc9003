"""The OTLP transport shared by the metrics and the logs: where, with what, over what.

One :class:`OtlpSettings` (the ``otlp_*`` settings) and the process's
``OTEL_EXPORTER_OTLP_*`` variables resolve, per signal, into one
:class:`Transport`: protocol, endpoint, headers, TLS files, compression and
timeout, each checked here at start-up (a bad one is an
:class:`OtlpSetupError` naming the setting or variable), and the keyword
arguments the SDK's gRPC or HTTP log exporter takes. What is not set is left to
the exporter (the SDK's for logs, :mod:`otel_gpu.export.otlp.client` for
metrics), which reads the same variables; settings win over variables.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote, urlparse

from otel_gpu._files import FileError, read_bytes, read_text
from otel_gpu.config import parse_endpoint
from otel_gpu.errors import SetupError

if TYPE_CHECKING:
    import requests

GRPC = "grpc"
HTTP = "http/protobuf"
PROTOCOLS = (GRPC, HTTP)
RESOURCE, ATTRIBUTES = "resource", "attributes"
METRICS, LOGS = "METRICS", "LOGS"
"""The signals, as they appear in the variables' names (``OTEL_EXPORTER_OTLP_LOGS_*``)."""
_PATHS = {METRICS: "/v1/metrics", LOGS: "/v1/logs"}


class OtlpSetupError(SetupError):
    """A bad OTLP setting found while building the exporter; one line."""


class OtlpRows(Protocol):
    """The rows of a :class:`~otel_gpu.config.Config` the OTLP settings come from (read-only,
    as a frozen ``Config`` has them)."""

    @property
    def otlp_endpoint(self) -> str | None: ...
    @property
    def otlp_protocol(self) -> str | None: ...
    @property
    def otlp_headers_file(self) -> str | None: ...
    @property
    def otlp_insecure(self) -> bool | None: ...
    @property
    def otlp_certificate(self) -> str | None: ...
    @property
    def otlp_client_certificate(self) -> str | None: ...
    @property
    def otlp_client_key(self) -> str | None: ...
    @property
    def otlp_compression(self) -> str | None: ...
    @property
    def otlp_timeout(self) -> float | None: ...
    @property
    def otlp_interval(self) -> float | None: ...
    @property
    def otlp_temporality(self) -> str | None: ...
    @property
    def pod_identity(self) -> str: ...


@dataclass(frozen=True)
class OtlpSettings:
    """otel-gpu's OTLP settings; ``None`` leaves one to the OTEL_* variables.

    One field per ``otlp_*`` row of :data:`otel_gpu.config.OPTIONS` (named
    without the prefix) plus ``pod_identity``, with the rows' defaults (a test
    keeps them the same).
    """

    endpoint: str | None = None
    protocol: str | None = None
    headers_file: str | None = None
    insecure: bool | None = None
    certificate: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None
    compression: str | None = None
    timeout: float | None = None
    interval: float | None = None
    temporality: str | None = None
    pod_identity: str = RESOURCE

    @classmethod
    def from_config(cls, config: OtlpRows) -> OtlpSettings:
        """The OTLP settings held by a :class:`~otel_gpu.config.Config`."""
        return cls(
            endpoint=config.otlp_endpoint, protocol=config.otlp_protocol,
            headers_file=config.otlp_headers_file, insecure=config.otlp_insecure,
            certificate=config.otlp_certificate,
            client_certificate=config.otlp_client_certificate,
            client_key=config.otlp_client_key, compression=config.otlp_compression,
            timeout=config.otlp_timeout, interval=config.otlp_interval,
            temporality=config.otlp_temporality, pod_identity=config.pod_identity,
        )


def variable(signal: str, name: str) -> str:
    """``OTEL_EXPORTER_OTLP_<SIGNAL>_<NAME>``."""
    return f"OTEL_EXPORTER_OTLP_{signal}_{name}"


def resolve_protocol(settings: OtlpSettings, environ: Mapping[str, str],
                     signal: str = METRICS) -> str:
    """Setting, else the signal's variable, else the generic one, else http/protobuf."""
    protocol = (
        settings.protocol
        or environ.get(variable(signal, "PROTOCOL"))
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or HTTP
    ).strip().lower()
    if protocol not in PROTOCOLS:
        raise OtlpSetupError(
            f"OTLP protocol {protocol!r} is not supported; use grpc or http/protobuf"
        )
    return protocol


def endpoint_configured(settings: OtlpSettings, environ: Mapping[str, str]) -> bool:
    """Whether the user pointed OTLP somewhere (which turns the OTLP exporter on)."""
    return bool(
        settings.endpoint
        or environ.get(variable(METRICS, "ENDPOINT"))
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
"""An HTTP field name (RFC 9110 token)."""
_ENV_ITEM = re.compile(r"^[ \t]*[!#$%&'*+.^_`|~0-9A-Za-z-]+[ \t]*=[ \t]*"
                       r"[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*$")
"""One ``key=value`` of an OTEL_EXPORTER_OTLP_*HEADERS variable, as the SDK reads it."""


def _value_problem(value: str) -> str | None:
    """What is wrong with a decoded header value, never quoting it (it may be a secret)."""
    if value != value.strip(" \t"):
        return "the value has leading or trailing spaces (after %-decoding)"
    if any(ch < " " or ch == "\x7f" for ch in value):
        return "the value contains a control character (after %-decoding)"
    if not value.isascii():
        return "the value is not ASCII (after %-decoding); %-encode it as UTF-8 bytes"
    return None


def read_headers_file(path: str) -> dict[str, str]:
    """``key=value`` per line or comma-separated, ``#`` comments; values may be %-encoded.

    Tokens can then come from a mounted Secret; they are never logged, nor
    quoted in an error: a bad header is named by its line (and its name, when
    that is a valid one).
    """
    try:
        text = read_text(path, "OTLP headers file")
    except FileError as exc:
        raise OtlpSetupError(str(exc)) from None
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for item in line.split(","):
            key, sep, value = item.partition("=")
            key = key.strip()
            where = f"OTLP headers file {path}: line {number}"
            if not sep or not key:
                raise OtlpSetupError(f"{where}: expected key=value")
            if not _TOKEN.match(key):
                raise OtlpSetupError(f"{where}: the header name is not an HTTP token (letters, "
                                     "digits and !#$%&'*+-.^_`|~ only)")
            decoded = unquote(value.strip())
            problem = _value_problem(decoded)
            if problem:
                raise OtlpSetupError(f"{where}: header {key.lower()!r}: {problem}")
            headers[key.lower()] = decoded
    return headers


def env_headers(environ: Mapping[str, str], signal: str = METRICS) -> dict[str, str]:
    """The OTEL_EXPORTER_OTLP_[<SIGNAL>_]HEADERS headers, read as the SDK reads them.

    An entry the SDK would drop, logging it whole, is refused here instead, by
    its position, so that no token reaches a log line.
    """
    name = variable(signal, "HEADERS")
    if not environ.get(name):
        name = "OTEL_EXPORTER_OTLP_HEADERS"
    headers: dict[str, str] = {}
    for position, item in enumerate(re.split(r"[ \t]*,[ \t]*", environ.get(name, "")), 1):
        if not item:
            continue
        where = f"{name}: header {position}"
        if not _ENV_ITEM.match(item):
            raise OtlpSetupError(f"{where}: expected key=value with a valid HTTP header name "
                                 "and the value %-encoded")
        key, _, value = item.partition("=")
        key = unquote(key).strip().lower()
        if not _TOKEN.match(key):
            raise OtlpSetupError(f"{where}: the header name is not an HTTP token once "
                                 "%-decoded")
        decoded = unquote(value).strip()
        problem = _value_problem(decoded)
        if problem:
            raise OtlpSetupError(f"{where} ({key!r}): {problem}")
        headers[key] = decoded
    return headers


_TLS_FILES = (("certificate", "CERTIFICATE"), ("client_certificate", "CLIENT_CERTIFICATE"),
              ("client_key", "CLIENT_KEY"))


def tls_files(settings: OtlpSettings, environ: Mapping[str, str],
              signal: str = METRICS) -> dict[str, tuple[str, str]]:
    """Each TLS file in use: name -> (path, where it came from).

    The setting, else ``OTEL_EXPORTER_OTLP_<SIGNAL>_<NAME>``, else
    ``OTEL_EXPORTER_OTLP_<NAME>``: the files the SDK would otherwise open at
    the first export.
    """
    out: dict[str, tuple[str, str]] = {}
    for name, var in _TLS_FILES:
        value = getattr(settings, name)
        if value:
            out[name] = (value, "otlp_" + name)
            continue
        for env in (variable(signal, var), f"OTEL_EXPORTER_OTLP_{var}"):
            if environ.get(env, "").strip():
                out[name] = (environ[env].strip(), env)
                break
    return out


def _no_password() -> bytes:
    return b""  # never let OpenSSL prompt on a terminal for an encrypted key


def load_tls(settings: OtlpSettings, environ: Mapping[str, str], protocol: str,
             signal: str = METRICS) -> dict[str, bytes]:
    """The PEM files named by the settings or variables, read and checked to be loadable."""
    files = tls_files(settings, environ, signal)
    data: dict[str, bytes] = {}
    for name, (path, origin) in files.items():
        try:
            data[name] = read_bytes(path, origin)
        except FileError as exc:
            raise OtlpSetupError(str(exc)) from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if "certificate" in data:
        path, origin = files["certificate"]
        try:
            context.load_verify_locations(cadata=data["certificate"].decode("ascii"))
        except (ssl.SSLError, ValueError) as exc:
            raise OtlpSetupError(
                f"{origin} {path}: not a PEM CA certificate bundle ({_ssl_reason(exc)})"
            ) from None
    if "client_key" in data and "client_certificate" not in data:
        path, origin = files["client_key"]
        raise OtlpSetupError(f"{origin} {path}: a client key needs a client certificate "
                             "(otlp_client_certificate)")
    if protocol == GRPC and "client_certificate" in data and "client_key" not in data:
        path, origin = files["client_certificate"]
        raise OtlpSetupError(f"{origin} {path}: gRPC needs the client key in a file of its own "
                             "(otlp_client_key)")
    if "client_certificate" in data:
        cert, cert_origin = files["client_certificate"]
        key, key_origin = files.get("client_key", (None, None))
        try:
            context.load_cert_chain(cert, key, password=_no_password)
        except (ssl.SSLError, OSError, ValueError) as exc:
            also = f" with {key_origin} {key}" if key else " (no client key given)"
            raise OtlpSetupError(
                f"{cert_origin} {cert}{also}: not a usable PEM certificate and unencrypted "
                f"private key ({_ssl_reason(exc)})"
            ) from None
    return data


def _ssl_reason(exc: Exception) -> str:
    """OpenSSL's reason, without its source location."""
    if isinstance(exc, UnicodeDecodeError):
        return "not PEM text"
    if isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError) and exc.strerror:
        return exc.strerror
    text = str(exc.args[-1]) if exc.args else str(exc)
    text = re.sub(r"^\[[^]]*\]\s*|\s*\(_ssl\.c:\d+\)$", "", " ".join(text.split()))
    if text == "PEM lib":
        return "not PEM, or the key is encrypted"
    return text or exc.__class__.__name__


def check_endpoint(settings: OtlpSettings, environ: Mapping[str, str], protocol: str,
                   signal: str = METRICS) -> None:
    """The endpoint in use is a URL (or host:port for gRPC): refused here, not at each export."""
    if settings.endpoint:
        endpoint, origin = settings.endpoint, "otlp_endpoint"
    else:
        found = next((v for v in (variable(signal, "ENDPOINT"), "OTEL_EXPORTER_OTLP_ENDPOINT")
                      if environ.get(v, "").strip()), None)
        if found is None:
            return
        endpoint, origin = environ[found], found
    try:
        parse_endpoint(endpoint)
    except ValueError as exc:
        raise OtlpSetupError(f"{origin}: {exc}") from None
    if protocol == HTTP and "://" not in endpoint:
        raise OtlpSetupError(f"{origin}: http/protobuf needs a URL such as "
                             f"http://collector:4318, got {endpoint.strip()!r}")


def signal_url(url: str, signal: str) -> str:
    """An OTLP/HTTP URL for ``signal``: another signal's path is replaced, a base URL gets
    the signal's path (``/v1/metrics``, ``/v1/logs``)."""
    path = urlparse(url).path.rstrip("/")
    wanted = _PATHS[signal]
    if path.endswith(wanted):
        return url
    base = url.rstrip("/")
    for other in _PATHS.values():
        if path.endswith(other):
            base = base[: -len(other)]
            break
    return base + wanted


@dataclass(frozen=True)
class Transport:
    """Where and how one signal is sent; ``None`` fields are left to the SDK's variables."""

    protocol: str
    endpoint: str | None
    headers: dict[str, str] | None
    tls: Mapping[str, bytes]
    """The PEM files' contents (for gRPC, which takes bytes)."""
    settings: OtlpSettings
    """The settings, with the TLS file paths in use filled in when they came from another
    signal's variables."""

    def grpc_arguments(self) -> dict[str, Any]:
        """Keyword arguments of the SDK's gRPC log exporter."""
        import grpc

        settings = self.settings
        credentials = None
        if settings.certificate or settings.client_certificate:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self.tls.get("certificate"),
                private_key=self.tls.get("client_key"),
                certificate_chain=self.tls.get("client_certificate"),
            )
        compression = None  # the SDK reads its variables
        if settings.compression is not None:
            compression = (grpc.Compression.Gzip if settings.compression == "gzip"
                           else grpc.Compression.NoCompression)
        return {"endpoint": self.endpoint, "insecure": settings.insecure,
                "credentials": credentials, "headers": self.headers,
                "timeout": settings.timeout, "compression": compression}

    def http_arguments(self) -> dict[str, Any]:
        """Keyword arguments of the SDK's HTTP log exporter."""
        from opentelemetry.exporter.otlp.proto.http import Compression

        settings = self.settings
        compression = settings.compression
        return {"endpoint": self.endpoint, "session": explicit_ca_session(),
                "certificate_file": settings.certificate,
                "client_key_file": settings.client_key,
                "client_certificate_file": settings.client_certificate,
                "headers": self.headers, "timeout": settings.timeout,
                "compression": Compression(compression) if compression else None}


DEFAULT_ENDPOINTS = {GRPC: "http://localhost:4317", HTTP: "http://localhost:4318"}
"""Where OTLP goes when no endpoint is set (the specification's defaults)."""


def url(transport: Transport, environ: Mapping[str, str], signal: str = METRICS) -> str:
    """Where ``transport`` sends ``signal``: its endpoint, else the signal's variable, else
    the generic one, else the default; a generic or default HTTP base URL gets the
    signal's path, as the SDK's exporters complete it."""
    endpoint = transport.endpoint or environ.get(variable(signal, "ENDPOINT"), "").strip()
    if endpoint:
        return endpoint
    base = (environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            or DEFAULT_ENDPOINTS[transport.protocol])
    return base if transport.protocol == GRPC else signal_url(base, signal)


def _own_endpoint(settings: OtlpSettings, environ: Mapping[str, str], signal: str) -> bool:
    return bool(settings.endpoint or environ.get(variable(signal, "ENDPOINT"), "").strip()
                or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip())


def resolve(settings: OtlpSettings, environ: Mapping[str, str],
            signal: str = METRICS) -> Transport:
    """The checked transport of ``signal``.

    Logs with no endpoint of their own (neither a setting, nor a logs nor a
    generic variable) follow the metrics' endpoint: the metrics' variables are
    then read here and passed to the logs' exporter explicitly (the SDK's
    would not read them).
    """
    if signal != METRICS and not _own_endpoint(settings, environ, signal) and environ.get(
            variable(METRICS, "ENDPOINT"), "").strip():
        followed = _resolve(settings, environ, METRICS, explicit=True)
        assert followed.endpoint is not None
        endpoint = (followed.endpoint if followed.protocol == GRPC
                    else signal_url(followed.endpoint, signal))
        return replace(followed, endpoint=endpoint)
    return _resolve(settings, environ, signal, explicit=False)


def _resolve(settings: OtlpSettings, environ: Mapping[str, str], signal: str, *,
             explicit: bool) -> Transport:
    """Every value checked; with ``explicit``, the variables' values passed on as arguments."""
    protocol = resolve_protocol(settings, environ, signal)
    check_endpoint(settings, environ, protocol, signal)
    from_env = env_headers(environ, signal)
    from_file = read_headers_file(settings.headers_file) if settings.headers_file else None
    tls = load_tls(settings, environ, protocol, signal)
    headers = {**from_env, **from_file} if from_file is not None else None
    endpoint = settings.endpoint
    if explicit:
        headers = {**from_env, **(from_file or {})}
        files = {name: path for name, (path, _) in tls_files(settings, environ, signal).items()}
        settings = replace(settings, certificate=files.get("certificate"),
                           client_certificate=files.get("client_certificate"),
                           client_key=files.get("client_key"))
        if endpoint is None:
            endpoint = environ.get(variable(signal, "ENDPOINT"), "").strip() or None
    if endpoint and protocol != GRPC:
        endpoint = signal_url(endpoint, signal)
    return Transport(protocol, endpoint, headers, tls, settings)


def explicit_ca_session() -> requests.Session:
    """A requests session in which a configured CA beats REQUESTS_CA_BUNDLE.

    ``requests`` lets those variables override the session's CA, so an
    ``OTEL_EXPORTER_OTLP_CERTIFICATE`` or ``otlp_certificate`` would be ignored
    on any machine that sets them for other software.
    """
    import requests

    class Session(requests.Session):
        def merge_environment_settings(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            merged: dict[str, Any] = super().merge_environment_settings(*args, **kwargs)
            if isinstance(self.verify, str):
                merged["verify"] = self.verify
            return merged

    return Session()
