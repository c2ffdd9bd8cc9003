"""The collector's own process from /proc: the reader over a written /proc tree, and the
semantic conventions' rows."""

from __future__ import annotations

import os

from otel_gpu.instrument.process import PROCESS_METRICS, ProcessReader

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _proc(tmp_path, comm="otel-gpu", fds=5, limit="1048576"):
    """A /proc tree: stat with utime 250 and stime 50 ticks, started 100 ticks after boot,
    4 MiB virtual, 300 pages resident."""
    me = tmp_path / "self"
    (me / "fd").mkdir(parents=True)
    for n in range(fds):
        (me / "fd" / str(n)).touch()
    # fields 3.. : state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice threads itreal starttime vsize rss
    rest = "S 1 1 1 0 -1 0 0 0 0 0 250 50 0 0 20 0 4 0 100 4194304 300 18446744073709551615"
    (me / "stat").write_text(f"4242 ({comm}) {rest}\n")
    (me / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        f"Max open files            {limit}              1048576              files\n")
    (tmp_path / "stat").write_text("cpu  1 2 3\nintr 9 9 9\nbtime 1700000000\nprocesses 9\n")
    return tmp_path


def test_reads_cpu_memory_start_and_descriptors(tmp_path):
    stats = ProcessReader(_proc(tmp_path)).read()
    assert stats.cpu_user_s == 250 / TICKS and stats.cpu_system_s == 50 / TICKS
    assert stats.cpu_s == round(300 / TICKS, 6)
    assert stats.virtual_bytes == 4194304 and stats.resident_bytes == 300 * PAGE
    assert stats.start_time_s == 1700000000 + 100 / TICKS
    assert stats.open_fds == 5 and stats.max_fds == 1048576


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields(tmp_path):
    stats = ProcessReader(_proc(tmp_path, comm="a) b (c")).read()
    assert stats.virtual_bytes == 4194304 and stats.cpu_user_s == 250 / TICKS


def test_an_unlimited_soft_limit_is_no_value(tmp_path):
    assert ProcessReader(_proc(tmp_path, limit="unlimited")).read().max_fds is None


def test_without_proc_every_value_is_left_out(tmp_path):
    stats = ProcessReader(tmp_path / "nothing").read()
    assert stats == type(stats)()
    assert stats.cpu_s is None


def test_a_malformed_stat_gives_no_values_rather_than_wrong_ones(tmp_path):
    root = _proc(tmp_path)
    (root / "self" / "stat").write_text("4242 (x) S 1 2\n")
    stats = ProcessReader(root).read()
    assert stats.cpu_user_s is None and stats.resident_bytes is None
    assert stats.open_fds == 5  # the descriptors are read apart


def test_this_process_is_read_from_the_real_proc():
    stats = ProcessReader().read()
    assert stats.resident_bytes and stats.resident_bytes > 1 << 20
    assert stats.open_fds and stats.max_fds and stats.open_fds <= stats.max_fds
    assert stats.cpu_s is not None and stats.cpu_s > 0
    assert stats.start_time_s is not None


def test_the_rows_are_the_semantic_conventions_process_metrics():
    from opentelemetry.semconv._incubating.metrics import process_metrics as semconv

    names = {m.name for m in PROCESS_METRICS}
    assert names == {semconv.PROCESS_CPU_TIME, semconv.PROCESS_MEMORY_USAGE,
                     semconv.PROCESS_MEMORY_VIRTUAL, semconv.PROCESS_UNIX_FILE_DESCRIPTOR_COUNT,
                     semconv.PROCESS_UPTIME}
    by_name = {m.name: m for m in PROCESS_METRICS}
    cpu = list(by_name["process.cpu.time"].per_node(None, 0.0))  # type: ignore[arg-type]
    assert sorted(attrs["cpu.mode"] for _, attrs in cpu) == ["system", "user"]
    for metric in PROCESS_METRICS:
        assert metric.per_node is not None
        assert list(metric.per_node(None, 0.0)), metric.name  # type: ignore[arg-type]


def test_the_own_limit_is_the_kernels_now_as_proc_says_it():
    """This process's descriptor limit is asked of the kernel at each read (no parse of
    /proc/self/limits per scrape), and follows a change of it."""
    import subprocess
    import sys

    probe = ("import resource\n"
             "from otel_gpu.instrument.process import READER\n"
             "before = READER.max_fds()\n"
             "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
             "resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 200) - 1, hard))\n"
             "limits = open('/proc/self/limits').read().split('Max open files')[1].split()[0]\n"
             "print(before == soft, READER.max_fds(), limits)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out[0] == "True" and out[1] == out[2] and int(out[1]) < 200
