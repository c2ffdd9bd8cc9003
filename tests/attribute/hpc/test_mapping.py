"""dcgm-exporter's job mapping directory: names, lines, bounds, and the watcher."""

from __future__ import annotations

import logging
import os

import pytest

from otel_gpu.attribute.hpc import mapping
from otel_gpu.attribute.hpc.mapping import (
    MAX_FILE_BYTES,
    MAX_JOB_ID_CHARS,
    MAX_JOBS_PER_FILE,
    DeviceKey,
    MappingWatcher,
    parse_jobs,
    parse_name,
)
from tests.support.clock import FakeClock


@pytest.mark.parametrize(("name", "key"), [
    ("0", DeviceKey(0)),
    ("7", DeviceKey(7)),
    ("42", DeviceKey(42)),
    ("3.0", DeviceKey(3, 0)),
    ("0.13", DeviceKey(0, 13)),
    ("2.10", DeviceKey(2, 10)),
])
def test_a_file_is_named_by_gpu_index_or_index_dot_gpu_instance(name, key):
    assert parse_name(name) == key


@pytest.mark.parametrize("name", [
    "", "foo", "bar.txt", ".gitkeep", "1e5", "NaN", "+3", "-2", ".5", "5.", "1.2.3",
    "0.1.2", "GPU-1", "1 ", "1.tmp", "٣", "1234567",
])
def test_other_names_are_not_mapping_files(name):
    assert parse_name(name) is None


def test_each_line_is_a_job_id_in_order_once_blanks_ignored():
    jobs, problems = parse_jobs("job2\n\n  job1 \njob2\r\n1234_5\n1234+0\n")
    assert jobs == ("job2", "job1", "1234_5", "1234+0")
    assert problems == []


def test_bad_lines_are_named_and_skipped_the_good_ones_kept():
    long = "9" * (MAX_JOB_ID_CHARS + 1)
    jobs, problems = parse_jobs(f"1\nbad id\n{long}\n2\n$(rm)\n")
    assert jobs == ("1", "2")
    assert [p.split(":")[0] for p in problems] == ["line 2", "line 3", "line 5"]
    assert f"at most {MAX_JOB_ID_CHARS}" in problems[1]


def test_a_file_gives_at_most_so_many_jobs():
    jobs, problems = parse_jobs("\n".join(str(n) for n in range(MAX_JOBS_PER_FILE + 5)))
    assert jobs == tuple(str(n) for n in range(MAX_JOBS_PER_FILE))
    assert problems == [f"more than {MAX_JOBS_PER_FILE} job ids; the rest are ignored"]


# --- the watcher ---------------------------------------------------------------------------


def _write(path, text: str) -> None:
    path.write_text(text)


def test_gpus_and_mig_instances_get_their_files_jobs(tmp_path):
    _write(tmp_path / "0", "1001\n")
    _write(tmp_path / "1", "1002\n1003\n")
    _write(tmp_path / "3.0", "job3.0-0")  # no newline at the end
    _write(tmp_path / "3.1", "2001\n")
    _write(tmp_path / "README", "not a mapping file\n")
    (tmp_path / "4").mkdir()  # a directory named like a GPU is skipped
    assert dict(MappingWatcher(tmp_path).jobs()) == {
        DeviceKey(0): ("1001",),
        DeviceKey(1): ("1002", "1003"),
        DeviceKey(3, 0): ("job3.0-0",),
        DeviceKey(3, 1): ("2001",),
    }


def test_an_empty_file_gives_no_jobs(tmp_path):
    _write(tmp_path / "0", "")
    _write(tmp_path / "1", "5\n")
    assert dict(MappingWatcher(tmp_path).jobs()) == {DeviceKey(1): ("5",)}


def test_a_change_is_picked_up_and_an_unchanged_file_is_not_read_again(tmp_path, monkeypatch):
    _write(tmp_path / "0", "1001\n")
    _write(tmp_path / "1", "1002\n")
    watcher = MappingWatcher(tmp_path)
    assert dict(watcher.jobs()) == {DeviceKey(0): ("1001",), DeviceKey(1): ("1002",)}

    reads: list[str] = []
    real = mapping.read_text
    monkeypatch.setattr(mapping, "read_text",
                        lambda path, *a, **kw: reads.append(os.path.basename(path))
                        or real(path, *a, **kw))
    assert dict(watcher.jobs()) == {DeviceKey(0): ("1001",), DeviceKey(1): ("1002",)}
    assert reads == []  # nothing changed: nothing read

    _write(tmp_path / "0", "1001\n1004\n")  # the prolog of a second job on GPU 0
    assert dict(watcher.jobs()) == {DeviceKey(0): ("1001", "1004"), DeviceKey(1): ("1002",)}
    assert reads == ["0"]

    (tmp_path / "1").unlink()  # the epilog of job 1002
    assert dict(watcher.jobs()) == {DeviceKey(0): ("1001", "1004")}

    tmp = tmp_path / ".1.tmp"  # written aside, then renamed over: a new inode
    _write(tmp, "1005\n")
    tmp.rename(tmp_path / "1")
    assert dict(watcher.jobs()) == {DeviceKey(0): ("1001", "1004"), DeviceKey(1): ("1005",)}


def test_a_bad_file_is_one_limited_line_and_the_others_keep_their_jobs(tmp_path, caplog):
    clock = FakeClock()
    _write(tmp_path / "0", "1001\n")
    (tmp_path / "1").write_bytes(b"\xff\xfe1002\n")  # not UTF-8
    _write(tmp_path / "2", "x" * (MAX_FILE_BYTES + 1))
    os.mkfifo(tmp_path / "3")  # never opened: it would block
    (tmp_path / "5").symlink_to("/dev/zero")
    _write(tmp_path / "6", "1006\nnot a job\n")
    watcher = MappingWatcher(tmp_path, clock=clock)
    with caplog.at_level(logging.WARNING, logger="otel_gpu.attribute.hpc.mapping"):
        assert dict(watcher.jobs()) == {DeviceKey(0): ("1001",), DeviceKey(6): ("1006",)}
        first = [r.getMessage() for r in caplog.records]
        for name, why in (("1", "not UTF-8"), ("2", "too large"), ("3", "not a regular file"),
                          ("5", "not a regular file"), ("6", "line 2")):
            said = [m for m in first if f"{tmp_path / name}" in m]
            assert len(said) == 1 and why in said[0], (name, first)
        caplog.clear()
        for _ in range(3):  # nothing changed: nothing said again
            watcher.jobs()
        (tmp_path / "1").write_bytes(b"\xff\xfe1003\n")  # still bad, rewritten: within the window
        watcher.jobs()
        assert caplog.records == []
        clock.advance(mapping.LOG_EVERY_S + 1)
        (tmp_path / "1").write_bytes(b"\xff\xfe1004\n")
        watcher.jobs()
        assert [r.getMessage() for r in caplog.records] == [
            f"HPC job mapping file {tmp_path / '1'}: not UTF-8 text (byte 0xff at offset 0); "
            "its device gets no job from it (1 similar messages suppressed)"]


def test_entries_are_bounded(tmp_path, caplog):
    for n in range(10):
        _write(tmp_path / str(n), f"{n}\n")
    watcher = MappingWatcher(tmp_path, max_entries=4)
    with caplog.at_level(logging.WARNING, logger="otel_gpu.attribute.hpc.mapping"):
        assert len(watcher.jobs()) == 4
        watcher.jobs()
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"hpc_job_mapping_dir {tmp_path} has more than 4 entries; the rest are "
                    "ignored"]


def test_a_missing_directory_is_said_once_and_again_when_it_appears_or_goes(tmp_path, caplog):
    clock = FakeClock()
    directory = tmp_path / "jobs"
    watcher = MappingWatcher(directory, clock=clock)
    with caplog.at_level(logging.INFO, logger="otel_gpu.attribute.hpc.mapping"):
        for _ in range(5):
            assert dict(watcher.jobs()) == {}
        assert [r.levelno for r in caplog.records] == [logging.WARNING]
        assert "does not exist" in caplog.records[0].getMessage()
        caplog.clear()

        directory.mkdir()
        _write(directory / "0", "1001\n")
        clock.advance(1)
        for _ in range(3):
            assert dict(watcher.jobs()) == {DeviceKey(0): ("1001",)}
        assert [r.getMessage() for r in caplog.records] == [
            f"reading HPC job mapping files from {directory} (it exists again)"]
        caplog.clear()

        (directory / "0").unlink()
        directory.rmdir()
        clock.advance(mapping.LOG_EVERY_S + 1)
        for _ in range(3):
            assert dict(watcher.jobs()) == {}  # a directory that went takes its jobs with it
        assert len(caplog.records) == 1 and "does not exist" in caplog.records[0].getMessage()


def test_a_path_that_is_not_a_directory_is_said_once(tmp_path, caplog):
    path = tmp_path / "file"
    _write(path, "1\n")
    watcher = MappingWatcher(path)
    with caplog.at_level(logging.WARNING, logger="otel_gpu.attribute.hpc.mapping"):
        for _ in range(3):
            assert dict(watcher.jobs()) == {}
    assert [r.getMessage() for r in caplog.records] == [
        f"hpc_job_mapping_dir {path} not a directory: no job labels from mapping files"]
