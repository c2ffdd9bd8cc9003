"""TLS, client certificates and basic auth, both ways: the chart mounts the files the web
config names, gives the ServiceMonitor and PodMonitor the scheme, tlsConfig and basicAuth
that pass it, refuses (in one line) a monitor that could not, and its NOTES show a curl
that works. Checked by running otel-gpu as the rendered pod would, and scraping it as
Prometheus would with what the rendered ServiceMonitor names, and with the NOTES' curl."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import subprocess

import pytest
import yaml

from testkit.process import CollectorProcess, wait_until
from tests.deploy.helpers import CHART, ROOT, chart_with_notes, documents, helm_binary
from tests.support.certs import make_certs

jsonschema = pytest.importorskip("jsonschema")

OPERATOR_API = "monitoring.coreos.com/v1"
SERVER_NAME = "gpu-otel-gpu.monitoring.svc"  # the default: the Service's name
PASSWORD = "example-only-change-me"  # examples/web-config.yml's hash is this one's
BCRYPT = yaml.safe_load((ROOT / "examples" / "web-config.yml").read_text())[
    "basic_auth_users"]["prometheus"]


def _values(port: int = 9400, **scrape) -> dict:
    return {
        "image": {"repository": "registry.example.com/otel-gpu"},
        "port": port,
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "webConfig": {
            "enabled": True,
            "tlsSecret": "otel-gpu-tls",
            "config": {
                "tls_server_config": {
                    "cert_file": "tls.crt", "key_file": "tls.key",
                    "client_auth_type": "RequireAndVerifyClientCert",
                    "client_ca_file": "ca.crt"},
                "basic_auth_users": {"prometheus": BCRYPT},
            },
            "scrape": {
                "caSecret": {"name": "otel-gpu-tls"},
                "clientCertSecret": {"name": "prometheus-client"},
                "basicAuthSecret": {"name": "prometheus-basic-auth"},
                **scrape,
            },
        },
    }


def _helm(tmp_path, values: dict, *extra: str) -> subprocess.CompletedProcess:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return subprocess.run(
        [helm_binary(), "template", "gpu", str(chart_with_notes(tmp_path)),
         "--namespace", "monitoring", "-f", str(path), *extra],
        capture_output=True, text=True, timeout=120)


def _render(tmp_path, values: dict) -> tuple[dict, str]:
    assert not list(jsonschema.Draft7Validator(
        json.loads((CHART / "values.schema.json").read_text())).iter_errors(values))
    proc = _helm(tmp_path, values)
    assert proc.returncode == 0, proc.stderr
    objects = documents(proc.stdout)
    notes = next(o for o in objects if o["metadata"]["name"] == "rendered-notes")
    return ({o["kind"]: o for o in objects if o is not notes}, notes["data"]["NOTES.txt"])


def _endpoint(kinds: dict, kind: str) -> dict:
    spec = kinds[kind]["spec"]
    (endpoint,) = spec["endpoints"] if kind == "ServiceMonitor" else spec["podMetricsEndpoints"]
    return endpoint


# --- rendered ----------------------------------------------------------------------------

def test_monitors_scrape_over_https_with_the_ca_client_certificate_and_password(tmp_path):
    kinds, _ = _render(tmp_path, _values())
    for kind in ("ServiceMonitor", "PodMonitor"):
        endpoint = _endpoint(kinds, kind)
        assert endpoint["scheme"] == "https", kind
        assert endpoint["tlsConfig"] == {
            "ca": {"secret": {"name": "otel-gpu-tls", "key": "ca.crt"}},
            "cert": {"secret": {"name": "prometheus-client", "key": "tls.crt"}},
            "keySecret": {"name": "prometheus-client", "key": "tls.key"},
            "serverName": SERVER_NAME,
        }, kind
        assert endpoint["basicAuth"] == {
            "username": {"name": "prometheus-basic-auth", "key": "username"},
            "password": {"name": "prometheus-basic-auth", "key": "password"}}, kind
        assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True


def test_the_certificates_are_mounted_beside_the_web_config(tmp_path):
    kinds, _ = _render(tmp_path, _values())
    pod = kinds["DaemonSet"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "web-config"]
    assert volume["projected"]["sources"] == [
        {"secret": {"name": "gpu-otel-gpu-web-config"}}, {"secret": {"name": "otel-gpu-tls"}}]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "web-config"]
    config = yaml.safe_load(kinds["ConfigMap"]["data"]["otel-gpu.yaml"])
    assert config["web_config_file"] == f"{mount['mountPath']}/web-config.yml"


def test_skip_verify_only_when_asked_and_monitor_endpoint_values_win(tmp_path):
    values = _values(insecureSkipVerify=True, caSecret={"name": ""})
    kinds, notes = _render(tmp_path, values)
    tls = _endpoint(kinds, "ServiceMonitor")["tlsConfig"]
    assert tls["insecureSkipVerify"] is True and "ca" not in tls and "serverName" not in tls
    assert "curl -sf -k --cert client.crt" in notes
    kinds, _ = _render(tmp_path, _values())
    assert "insecureSkipVerify" not in _endpoint(kinds, "ServiceMonitor")["tlsConfig"]
    values = _values()
    values["serviceMonitor"]["endpoint"] = {"scheme": "http", "tlsConfig": {"serverName": "x"}}
    kinds, _ = _render(tmp_path, values)
    endpoint = _endpoint(kinds, "ServiceMonitor")
    assert endpoint["scheme"] == "http" and endpoint["tlsConfig"] == {"serverName": "x"}


def test_without_a_web_config_the_monitors_scrape_plain_http(tmp_path):
    values = {"image": {"repository": "registry.example.com/otel-gpu"},
              "serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}
    kinds, notes = _render(tmp_path, values)
    for kind in ("ServiceMonitor", "PodMonitor"):
        endpoint = _endpoint(kinds, kind)
        assert endpoint["scheme"] == "http"
        assert "tlsConfig" not in endpoint and "basicAuth" not in endpoint
    assert "curl -s localhost:9400/metrics" in notes


def test_an_existing_web_config_with_tls_probes_asks_for_https(tmp_path):
    values = {"image": {"repository": "registry.example.com/otel-gpu"},
              "serviceMonitor": {"enabled": True},
              "webConfig": {"enabled": True, "existingSecret": "my-web", "probeScheme": "HTTPS",
                            "scrape": {"caSecret": {"name": "my-ca", "key": "ca.pem"},
                                       "serverName": "gpu.example.com"}}}
    kinds, notes = _render(tmp_path, values)
    endpoint = _endpoint(kinds, "ServiceMonitor")
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": "my-ca", "key": "ca.pem"}},
                                     "serverName": "gpu.example.com"}
    assert "jsonpath='{.data.ca\\.pem}'" in notes
    assert "https://gpu.example.com:9400/metrics" in notes


REFUSALS = [
    ({"caSecret": {"name": ""}}, "webConfig: Prometheus cannot verify otel-gpu's certificate: "
     "set webConfig.scrape.caSecret.name"),
    ({"clientCertSecret": {"name": ""}}, "webConfig: the web config requires a client "
     "certificate: set webConfig.scrape.clientCertSecret.name"),
    ({"basicAuthSecret": {"name": ""}}, "webConfig: the web config asks for a password: "
     "set webConfig.scrape.basicAuthSecret.name"),
]


@pytest.mark.parametrize(("scrape", "says"), REFUSALS, ids=["ca", "client-cert", "password"])
def test_a_monitor_that_could_not_scrape_is_refused_in_one_line(tmp_path, scrape, says):
    proc = _helm(tmp_path, _values(**scrape))
    assert proc.returncode != 0
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert says in line, line
    # without a monitor, nothing needs Prometheus's side
    values = _values(**scrape)
    values["serviceMonitor"]["enabled"] = values["podMonitor"]["enabled"] = False
    proc = _helm(tmp_path, values)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("change", "says"), [
    ({"tlsSecret": ""}, "webConfig.config.tls_server_config.cert_file: tls.crt is not in the "
     "pod, which gets only web-config.yml: set webConfig.tlsSecret"),
    ({"config": {"tls_server_config": {"cert_file": "/etc/tls/tls.crt", "key_file": "tls.key"}}},
     "webConfig.config.tls_server_config.cert_file: /etc/tls/tls.crt is not in the pod"),
])
def test_a_web_config_naming_files_the_pod_lacks_is_refused(tmp_path, change, says):
    values = _values()
    values["webConfig"].update(change)
    proc = _helm(tmp_path, values)
    assert proc.returncode != 0
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert says in line, line


# --- run: otel-gpu as the pod would, scraped as the ServiceMonitor says ------------------

def _secrets(tmp_path) -> dict[str, dict[str, bytes]]:
    certs = make_certs(tmp_path / "certs", hostnames=(SERVER_NAME,), ips=())
    return {
        "otel-gpu-tls": {"tls.crt": certs.server_cert.read_bytes(),
                         "tls.key": certs.server_key.read_bytes(),
                         "ca.crt": certs.ca_cert.read_bytes()},
        "prometheus-client": {"tls.crt": certs.client_cert.read_bytes(),
                              "tls.key": certs.client_key.read_bytes()},
        "prometheus-basic-auth": {"username": b"prometheus", "password": PASSWORD.encode()},
    }


def _start_pod(tmp_path, kinds: dict, secrets: dict) -> CollectorProcess:
    """otel-gpu with the rendered configuration and the web-config volume's files."""
    secrets = {**secrets, kinds["Secret"]["metadata"]["name"]: {
        k: v.encode() for k, v in kinds["Secret"]["stringData"].items()}}
    pod = kinds["DaemonSet"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "web-config"]
    web = tmp_path / "web"
    web.mkdir()
    for source in volume["projected"]["sources"]:
        for key, data in secrets[source["secret"]["name"]].items():
            (web / key).write_bytes(data)
            (web / key).chmod(0o600)
    config = yaml.safe_load(kinds["ConfigMap"]["data"]["otel-gpu.yaml"])
    config.pop("sysfs_root")
    config.update(web_config_file=str(web / "web-config.yml"), listen="127.0.0.1:0",
                  kubelet_socket=str(tmp_path / "no-kubelet.sock"))
    (tmp_path / "otel-gpu.yaml").write_text(yaml.safe_dump(config))
    proc = CollectorProcess(["serve", "--config", str(tmp_path / "otel-gpu.yaml"),
                             "--simulate", "t4", "--interval", "0.2"])
    proc.wait_serving()
    return proc


def _scrape(endpoint: dict, port: int, secrets: dict, tmp_path, *, password: bool = True,
            client_cert: bool = True):
    """GET the endpoint's path as Prometheus would with the endpoint's fields."""
    def secret(ref: dict) -> bytes:
        return secrets[ref["name"]][ref["key"]]

    assert endpoint["scheme"] == "https"
    tls = endpoint["tlsConfig"]
    context = ssl.create_default_context(cadata=secret(tls["ca"]["secret"]).decode())
    if client_cert:
        (tmp_path / "client.crt").write_bytes(secret(tls["cert"]["secret"]))
        (tmp_path / "client.key").write_bytes(secret(tls["keySecret"]))
        context.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    headers = {}
    if password:
        auth = endpoint["basicAuth"]
        user = secret(auth["username"]) + b":" + secret(auth["password"])
        headers["Authorization"] = "Basic " + base64.b64encode(user).decode()
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = http.client.HTTPSConnection(tls["serverName"], port, timeout=10)
    conn.sock = context.wrap_socket(raw, server_hostname=tls["serverName"])
    try:
        conn.request("GET", endpoint["path"], headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_the_rendered_pod_is_scraped_with_what_the_monitors_name(tmp_path):
    secrets = _secrets(tmp_path)
    kinds, _ = _render(tmp_path, _values())
    proc = _start_pod(tmp_path, kinds, secrets)
    try:
        for kind in ("ServiceMonitor", "PodMonitor"):
            endpoint = _endpoint(kinds, kind)

            def scraped(endpoint=endpoint):
                status, body = _scrape(endpoint, proc.port, secrets, tmp_path)
                return body if status == 200 else None

            body = wait_until(scraped, what=f"a scrape as the {kind} says")
            assert "hw_gpu_utilization" in body or "hw_status" in body, body[:500]
        # and each part is needed: the web config is enforced
        endpoint = _endpoint(kinds, "ServiceMonitor")
        status, _ = _scrape(endpoint, proc.port, secrets, tmp_path, password=False)
        assert status == 401
        with pytest.raises((OSError, http.client.HTTPException)):
            _scrape(endpoint, proc.port, secrets, tmp_path, client_cert=False)
    finally:
        proc.stop()


def test_the_notes_curl_works_as_written(tmp_path):
    """The NOTES' commands run as printed (kubectl answering from the test's Secrets), the
    port-forward replaced by otel-gpu listening on the port itself."""
    secrets = _secrets(tmp_path)
    kinds, _ = _render(tmp_path, _values())
    proc = _start_pod(tmp_path, kinds, secrets)
    try:
        _, notes = _render(tmp_path, _values(port=proc.port))
        lines = [ln.strip() for ln in notes.splitlines() if ln.startswith("  ")]
        commands = [ln for ln in lines if "port-forward" not in ln and "get pods" not in ln]
        assert any(c.startswith("curl") and "/metrics" in c for c in commands), notes
        store = tmp_path / "secrets"
        for name, data in secrets.items():
            (store / name).mkdir(parents=True)
            for key, value in data.items():
                (store / name / key).write_bytes(value)
        shims = tmp_path / "bin"
        shims.mkdir()
        (shims / "kubectl").write_text(
            "#!/bin/sh\n"
            '[ "$3 $4 $6" = "get secret -o" ] || { echo "unexpected: kubectl $*" >&2; exit 2; }\n'
            "key=$(printf %s \"$7\" | sed -e 's/^jsonpath={\\.data\\.//' -e 's/}$//'"
            " -e 's/\\\\\\././g')\n"
            f'base64 < "{store}/$5/$key"\n')
        (shims / "kubectl").chmod(0o755)
        work = tmp_path / "cwd"
        work.mkdir()
        env = {"PATH": f"{shims}:/usr/bin:/bin", "HOME": str(tmp_path)}
        script = "\n".join(commands)

        def answered():
            done = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=60)
            return done if done.returncode == 0 and "# TYPE" in done.stdout else None

        done = wait_until(answered, what=f"the NOTES' commands:\n{script}")
        assert "# TYPE" in done.stdout
        assert (work / "ca.crt").read_bytes() == secrets["otel-gpu-tls"]["ca.crt"]
    finally:
        proc.stop()
