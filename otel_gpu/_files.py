"""Reading the files a user points otel-gpu at, safely: bounded, typed, UTF-8, plain YAML.

Every file otel-gpu reads is outside input: at start-up (config, scenario,
counters CSV, web config, OTLP headers, certificates) and while it runs
(sysfs and procfs attributes, ``/proc/<pid>/cgroup``, HPC job mapping
files). Every one is read here and nowhere else (a test keeps it so). These
helpers refuse
what would hang or exhaust the process (a FIFO, ``/dev/zero``, a huge file,
a YAML alias bomb, deep nesting) and turn what would be a traceback (bytes
that are not UTF-8, duplicate keys) into one :class:`FileError` line naming
the file and the problem.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from otel_gpu.errors import SetupError

MAX_BYTES = 1 << 20
"""1 MiB: far more than any config, scenario, counters or PEM file needs."""
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 100_000


class FileError(SetupError):
    """A file that cannot be used; ``str()`` names it and says why, in one line."""


def read_bytes(path: str, what: str, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The whole content of a regular file of at most ``max_bytes``.

    Opened non-blocking, so a FIFO or a device is refused instead of hanging.
    """
    label = f"{what} {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FileError(f"{label}: cannot read it ({_reason(exc)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileError(f"{label}: not a regular file ({_kind(info.st_mode)})")
        if info.st_size > max_bytes:
            raise FileError(
                f"{label}: {info.st_size} bytes is too large (at most {max_bytes} bytes)"
            )
        chunks: list[bytes] = []
        total = 0
        while True:  # the size may change under us: bound the read itself too
            chunk = os.read(fd, min(65536, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise FileError(f"{label}: too large (at most {max_bytes} bytes)")
        return b"".join(chunks)
    except OSError as exc:
        raise FileError(f"{label}: cannot read it ({_reason(exc)})") from None
    finally:
        os.close(fd)


def read_text(path: str, what: str, *, max_bytes: int = MAX_BYTES) -> str:
    """:func:`read_bytes`, decoded as UTF-8 (a BOM is dropped)."""
    data = read_bytes(path, what, max_bytes=max_bytes)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileError(
            f"{what} {path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


SYSFS_MAX_BYTES = 1 << 16
"""64 KiB: a sysfs attribute is at most a page; a cpulist of thousands of CPUs fits."""


def read_attribute(path: str | os.PathLike[str], what: str = "sysfs file", *,
                   max_bytes: int = SYSFS_MAX_BYTES) -> str | None:
    """A sysfs or procfs attribute's text, stripped; ``None`` when it does not exist.

    The same checks as a user's file (non-blocking open, regular file, bounded read): a
    FIFO or a device put where an attribute should be cannot block discovery, sampling
    or attribution. One that exists but cannot be used is a :class:`FileError` naming
    it, so the caller can say so once. Undecodable bytes are replaced; the caller parses
    (and bounds) what it expects.
    """
    label = f"{what} {os.fspath(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise FileError(f"{label}: cannot read it ({_reason(exc)})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FileError(f"{label}: not a regular file ({_kind(mode)})")
        data = os.read(fd, max_bytes + 1)
    except OSError as exc:
        raise FileError(f"{label}: cannot read it ({_reason(exc)})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise FileError(f"{label}: too large (at most {max_bytes} bytes)")
    return data.decode("ascii", "replace").strip()


def read_sysfs(path: str | os.PathLike[str], *, max_bytes: int = SYSFS_MAX_BYTES) -> str | None:
    """:func:`read_attribute`, ``None`` also when the file cannot be used (for readers
    that treat a strange attribute as a missing one)."""
    try:
        return read_attribute(path, max_bytes=max_bytes)
    except FileError:
        return None


_MIXIN: Any = object  # the loaders' methods come from PyYAML, which has no type stubs


class _Rules(_MIXIN):
    """Safe YAML without aliases, without duplicate keys, with bounded depth and size: the
    composer and constructor rules both loaders below apply."""

    _depth = 0
    _nodes = 0

    def compose_node(self, parent: object, index: object) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, f"YAML aliases (*{event.anchor}) are not allowed", event.start_mark
            )
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            raise yaml.constructor.ConstructorError(
                None, None, f"more than {MAX_YAML_NODES} YAML nodes", self.peek_event().start_mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.constructor.ConstructorError(
                    None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader says so itself
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


class _PlainLoader(_Rules, yaml.SafeLoader):
    """The pure-Python loader: the reference for every error message."""


if getattr(yaml, "__with_libyaml__", False):

    class _FastPlainLoader(  # libyaml's scanner and parser under the same rules
        _Rules, yaml.composer.Composer, yaml.cyaml.CParser, yaml.constructor.SafeConstructor,
        yaml.resolver.Resolver,
    ):
        """The same nodes and checks as :class:`_PlainLoader` from libyaml's events, at a
        fraction of the parsing time (a scenario file is read at start-up)."""

        def __init__(self, stream: str) -> None:
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

    _LOADERS: tuple[type, ...] = (_FastPlainLoader, _PlainLoader)
else:  # pragma: no cover - PyYAML built without libyaml
    _LOADERS = (_PlainLoader,)


_TAG_ERRORS = (ValueError, LookupError, AttributeError, TypeError, ArithmeticError)
"""What PyYAML's constructors raise for tagged nonsense (``!!int x``, ``!!set ~``,
``!!float ""``, ``!!timestamp xyz``) instead of a YAMLError."""


def _load(text: str) -> Any:
    """The document through the fastest loader; a document it refuses is parsed again by
    the pure-Python one, so that the error (and its wording) is always that one's."""
    for loader in _LOADERS[:-1]:
        try:
            return yaml.load(text, Loader=loader)
        except (yaml.YAMLError, RecursionError, *_TAG_ERRORS):
            pass
    return yaml.load(text, Loader=_LOADERS[-1])


@contextlib.contextmanager
def _yaml_errors(label: str) -> Iterator[None]:
    """PyYAML's refusals as one :class:`FileError` naming ``label``, the line and the problem."""
    try:
        yield
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise FileError(f"{label}: {problem}{where}") from None
    except RecursionError:
        raise FileError(f"{label}: nested too deeply") from None
    except _TAG_ERRORS as exc:
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise FileError(f"{label}: invalid value ({text})") from None


def parse_yaml(text: str, label: str) -> Any:
    """One YAML document, or :class:`FileError` naming ``label``, the line and the problem."""
    with _yaml_errors(label):
        return _load(text)


def load_yaml(path: str, what: str, *, max_bytes: int = MAX_BYTES) -> Any:
    """A small YAML file, read with :func:`read_text` and parsed with :func:`parse_yaml`."""
    return parse_yaml(read_text(path, what, max_bytes=max_bytes), f"{what} {path}")


@dataclass(frozen=True)
class Unreadable:
    """A value YAML cannot build as its tag says (``!!timestamp xyz``, ``!!int x``): kept in
    its field's place, so that whoever reads the field names it and says what it takes."""

    tag: str
    text: str
    line: int

    def __str__(self) -> str:
        tag = self.tag.replace("tag:yaml.org,2002:", "!!")
        shown = repr(self.text) if len(self.text) <= 40 else repr(self.text[:37]) + "..."
        what = shown if self.text else "a value"
        if not tag.startswith("!!"):
            return f"{what} tagged {tag}, a tag no setting reads (line {self.line})"
        return f"{what} tagged {tag}, which YAML cannot read as that (line {self.line})"


def _build(node: Any) -> object:
    """One node as a value, or :class:`Unreadable` where its tag's constructor refuses it (a
    plain list item by item, so that the one bad item is the one named)."""
    if isinstance(node, yaml.SequenceNode) and node.tag == "tag:yaml.org,2002:seq":
        return [_build(item) for item in node.value]
    loader = _PlainLoader("")
    try:
        return loader.construct_document(node)
    except (yaml.YAMLError, RecursionError, *_TAG_ERRORS):
        text = node.value if isinstance(node, yaml.ScalarNode) else ""
        return Unreadable(str(node.tag), str(text), node.start_mark.line + 1)
    finally:
        loader.dispose()


_NULL_TAG = "tag:yaml.org,2002:null"


def load_yaml_fields(path: str, what: str, *, fields: str = "fields") -> dict[object, object]:
    """A small YAML file whose top level maps names to values (``{}`` when it holds none:
    empty, only comments, or a null document such as ``~``, ``null`` or ``---``).

    Each value is built on its own: one whose tag YAML cannot build is an
    :class:`Unreadable` in its place instead of an error for the whole file,
    so the caller can say which field it is and what that field takes. The
    file is read and composed under the same rules as :func:`load_yaml`.
    """
    label = f"{what} {path}"
    text = read_text(path, what)
    with _yaml_errors(label):
        loader = _PlainLoader(text)  # the reader refuses control characters here
    try:
        with _yaml_errors(label):
            root = loader.get_single_node()
        if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == _NULL_TAG):
            return {}  # null counts as absent, in a whole file as in a setting
        if not isinstance(root, yaml.MappingNode):
            raise FileError(f"{label}: expected a mapping of {fields} at the top level")
        with _yaml_errors(label):
            loader.flatten_mapping(root)  # `<<` merge keys, as the whole-document loaders do
    finally:
        loader.dispose()
    result: dict[object, object] = {}
    for key_node, value_node in root.value:
        key = _build(key_node)
        line = key_node.start_mark.line + 1
        try:
            duplicate = key in result
        except TypeError:
            raise FileError(f"{label}: a key at line {line} is not a name") from None
        if duplicate:
            raise FileError(f"{label}: duplicate key {key!r} at line {line}, "
                            f"column {key_node.start_mark.column + 1}")
        result[key] = _build(value_node)
    return result


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENXIO:
        return "no reader on the other end"
    return exc.strerror or str(exc)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"
