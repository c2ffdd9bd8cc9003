"""scripts/get-prometheus.sh, which scripts/test.sh runs for promtool and the Prometheus
server: it unpacks Debian's package into a cache and never installs it, so no maintainer
script runs and no Prometheus server is enabled or started on the machine.

apt-get is a fake here, serving a package whose maintainer script records that it ran
(as installing the real package starts a server): the script must fetch the binaries
without setting it off."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

from tests.deploy.helpers import ROOT, tool

SCRIPT = ROOT / "scripts" / "get-prometheus.sh"

FAKE_APT = textwrap.dedent("""\
    #!/usr/bin/env bash
    # A fake apt-get: logs its arguments; `download prometheus` writes a package whose
    # postinst leaves a marker; `install` runs that postinst, as dpkg would.
    set -eu
    echo "$*" >> "$FAKE_LOG"
    args=" $* "
    build() {
      tree=$(mktemp -d)
      mkdir -p "$tree/DEBIAN" "$tree/usr/bin"
      printf '%s\\n' 'Package: prometheus' 'Version: 2.42.0' 'Architecture: all' \\
        'Maintainer: t <t@t>' 'Description: fake' > "$tree/DEBIAN/control"
      printf '#!/bin/sh\\ntouch "%s"\\n' "$FAKE_STARTED" > "$tree/DEBIAN/postinst"
      chmod 0755 "$tree/DEBIAN/postinst"
      for b in promtool prometheus; do
        printf '#!/bin/sh\\necho "%s, version 2.42.0 (fake)"\\n' "$b" > "$tree/usr/bin/$b"
        chmod 0755 "$tree/usr/bin/$b"
      done
      dpkg-deb --build --root-owner-group "$tree" "$1" >/dev/null
      rm -rf "$tree"
    }
    case "$args" in
      *" update "*) touch "$FAKE_LISTS" ;;
      *" download prometheus "*)
        [ -e "$FAKE_LISTS" ] || { echo "E: Can't select candidate version" >&2; exit 100; }
        build "prometheus_2.42.0_all.deb" ;;
      *" install "*) touch "$FAKE_STARTED" ;;  # the postinst, run by dpkg
      *) exit 100 ;;
    esac
    """)


def _run(tmp_path: Path, *, lists: bool) -> subprocess.CompletedProcess:
    tool("dpkg-deb", "Debian's dpkg")
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "apt-get").write_text(FAKE_APT)
    (fake / "apt-get").chmod(0o755)
    (fake / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (fake / "sudo").chmod(0o755)
    if lists:
        (tmp_path / "lists").touch()
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
           "FAKE_LOG": str(tmp_path / "apt.log"), "FAKE_LISTS": str(tmp_path / "lists"),
           "FAKE_STARTED": str(tmp_path / "server-started")}
    return subprocess.run([str(SCRIPT), str(tmp_path / "cache")], capture_output=True,
                          text=True, env=env, timeout=120)


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "apt.log"
    return log.read_text().splitlines() if log.exists() else []


def test_the_binaries_are_unpacked_and_no_maintainer_script_runs(tmp_path):
    proc = _run(tmp_path, lists=True)
    assert proc.returncode == 0, proc.stderr
    binaries = Path(proc.stdout.strip())
    assert binaries == tmp_path / "cache" / "bin"
    for name in ("promtool", "prometheus"):
        out = subprocess.run([str(binaries / name), "--version"], capture_output=True,
                             text=True, timeout=10).stdout
        assert out.startswith(f"{name}, version"), out
    # nothing was installed: the package's postinst (which starts the real server) never ran
    assert not (tmp_path / "server-started").exists()
    assert not any(" install " in f" {call} " for call in _calls(tmp_path)), _calls(tmp_path)
    assert sorted(p.name for p in (tmp_path / "cache").rglob("*")) == [
        "bin", "prometheus", "promtool"]


def test_missing_package_lists_are_updated_first(tmp_path):
    proc = _run(tmp_path, lists=False)
    assert proc.returncode == 0, proc.stderr
    calls = _calls(tmp_path)
    assert [next(w for w in c.split() if w in ("download", "update")) for c in calls] == [
        "download", "update", "download"], calls
    assert not (tmp_path / "server-started").exists()


def test_a_second_run_uses_the_cache(tmp_path):
    assert _run(tmp_path, lists=True).returncode == 0
    before = _calls(tmp_path)
    proc = _run(tmp_path, lists=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "cache" / "bin")
    assert _calls(tmp_path) == before


def test_the_test_script_fetches_prometheus_without_installing_it():
    text = (ROOT / "scripts" / "test.sh").read_text()
    assert "scripts/get-prometheus.sh" in text
    assert "apt-get install" not in text
