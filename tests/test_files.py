"""Reading user files: bounded, regular files only, UTF-8, plain YAML."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from otel_gpu import _files
from otel_gpu._files import (
    MAX_YAML_DEPTH,
    FileError,
    Unreadable,
    load_yaml,
    load_yaml_fields,
    parse_yaml,
    read_text,
)
from otel_gpu.errors import SetupError
from otel_gpu.sim.scenario import PROFILES_DIR


@pytest.mark.parametrize(("content", "problem"), [
    ("a: &x [1, 2]\nb: *x\n", "YAML aliases (*x) are not allowed at line 2"),
    ("a: 1\na: 2\n", "duplicate key 'a' at line 2"),
    ("[" * 50_000, f"nested deeper than {MAX_YAML_DEPTH} levels"),
    ("a: [1, 2\n", "at line 2"),
])
def test_yaml_that_is_refused(tmp_path, content, problem):
    path = tmp_path / "c.yaml"
    path.write_text(content)
    with pytest.raises(FileError, match="^config file .*c.yaml: ") as err:
        load_yaml(str(path), "config file")
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines))
    with pytest.raises(FileError, match="aliases"):
        load_yaml(str(path), "config file")


def test_anchors_and_nesting_within_bounds_are_fine():
    assert parse_yaml("a: &keep [1, {b: 2}]\n", "x") == {"a": [1, {"b": 2}]}


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "dir"])
def test_only_regular_files_are_read(tmp_path, special):
    if special == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)  # opening it for reading would block without a writer
    elif special == "dir":
        path = str(tmp_path)
    else:
        path = special
    with pytest.raises(FileError, match="not a regular file"):
        read_text(path, "headers file")


def test_size_and_encoding_are_checked(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(FileError, match="too large"):
        read_text(str(big), "file", max_bytes=100)
    latin = tmp_path / "latin"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(FileError, match=r"not UTF-8 text \(byte 0xe9 at offset 9\)"):
        read_text(str(latin), "file")
    assert read_text(str(big), "file") == "x" * 101


def test_file_errors_are_setup_errors(tmp_path):
    with pytest.raises(SetupError, match="cannot read it"):
        read_text(str(tmp_path / "absent"), "file")


@pytest.mark.parametrize("doc", ["a: !!int x\n", "a: !!set ~\n", "a: !!bool x\n",
                                 "a: !!timestamp x\n", "a: !!map ~\n", "a: !!float ''\n"])
def test_tags_yaml_cannot_build_are_one_line(doc):
    with pytest.raises(FileError, match=r"^f: invalid value \(.+\)$"):
        parse_yaml(doc, "f")


_LIBYAML = pytest.mark.skipif(len(_files._LOADERS) < 2, reason="PyYAML without libyaml")


@_LIBYAML
@pytest.mark.parametrize("path", sorted(
    [*PROFILES_DIR.glob("*.yaml"), *(Path(__file__).parent.parent / "config").glob("*.yaml")]),
    ids=lambda p: p.name)
def test_libyaml_and_pure_python_loaders_read_the_same_documents(path):
    text = path.read_text()
    fast, plain = _files._LOADERS
    assert yaml.load(text, Loader=fast) == yaml.load(text, Loader=plain)


@_LIBYAML
@pytest.mark.parametrize("doc", [
    "a: &x 1\nb: *x\n", "a: 1\na: 2\n", "[" * (MAX_YAML_DEPTH + 2) + "]" * (MAX_YAML_DEPTH + 2),
])
def test_the_libyaml_loader_applies_the_same_rules_by_itself(doc):
    """The fast path must never accept what the reference loader refuses: the fallback
    only rewords errors, it is not the check."""
    with pytest.raises(yaml.constructor.ConstructorError):
        yaml.load(doc, Loader=_files._LOADERS[0])


def test_fields_keep_each_unbuildable_value_in_its_place(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\nb: !!timestamp xyz\nc: [x, !!int y]\nd: !!binary aGk=\ne: !!float ''\n"
                    "<<: {f: 2}\n")
    fields = load_yaml_fields(str(path), "file")
    assert fields["a"] == 1 and fields["d"] == b"hi" and fields["f"] == 2
    assert fields["b"] == Unreadable("tag:yaml.org,2002:timestamp", "xyz", 2)
    assert str(fields["b"]) == "'xyz' tagged !!timestamp, which YAML cannot read as that (line 2)"
    assert fields["c"] == ["x", Unreadable("tag:yaml.org,2002:int", "y", 3)]
    assert fields["e"] == Unreadable("tag:yaml.org,2002:float", "", 5)


@pytest.mark.parametrize(("doc", "message"), [
    ("a: 1\na: 2\n", r"^file .*: duplicate key 'a' at line 2, column 1$"),
    ("[a]\n", r"^file .*: expected a mapping of fields at the top level$"),
    ("[a]: 1\n", r"^file .*: a key at line 1 is not a name$"),
    ("a: &x 1\nb: *x\n", r"^file .*: YAML aliases \(\*x\) are not allowed at line 2"),
    ("a: [1\n", r"^file .*: .* at line \d+"),
])
def test_fields_refuse_what_the_whole_file_loader_refuses(tmp_path, doc, message):
    path = tmp_path / "c.yaml"
    path.write_text(doc)
    with pytest.raises(FileError, match=message):
        load_yaml_fields(str(path), "file")


def test_fields_of_an_empty_document_are_empty(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# nothing\n")
    assert load_yaml_fields(str(path), "file") == {}
