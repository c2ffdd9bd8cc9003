"""A kubelet socket that is not there: the real process keeps waiting, and says so."""

from __future__ import annotations

from testkit.process import wait_until


def _reason(proc) -> str:
    status, _, body = proc.get("/readyz")
    return f"{status} {body.decode().strip()}"


def test_a_mistyped_socket_is_warned_of_and_named_by_readyz_while_ready(collector, tmp_path):
    path = tmp_path / "kubelet.sokc"
    proc = collector("--simulate", "t4", "--kubelet-socket", str(path),
                     "--kubelet-interval", "0.1", "--kubelet-grace-period", "0.5")
    reason = str(wait_until(
        lambda: (r := _reason(proc)).startswith("200 ready:") and "pods not attributed" in r
        and r, 15.0, "the reason naming the missing socket"))
    assert f"; pods not attributed: no kubelet socket at {path} for " in reason, reason
    wait_until(lambda: any(f"still no kubelet socket at {path}" in ln and "WARNING" in ln
                           for ln in proc.lines), 10.0, "the warning")


def test_a_directory_gets_a_line_that_says_so(collector, tmp_path):
    proc = collector("--simulate", "t4", "--kubelet-socket", str(tmp_path),
                     "--kubelet-interval", "0.1")
    wait_until(lambda: any(f"kubelet_socket {tmp_path} is a directory" in ln
                           for ln in proc.lines), 10.0, "the directory line")
    assert not any("mount its directory" in ln for ln in proc.lines), proc.log
    reason = str(wait_until(lambda: (r := _reason(proc)).startswith("200 ready:") and r, 15.0))
    assert reason.endswith(f"; pods not attributed: kubelet_socket {tmp_path} is a directory, "
                           "not the socket"), reason
