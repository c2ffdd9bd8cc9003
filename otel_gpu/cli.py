"""Command line: ``otel-gpu [serve]``, ``otel-gpu check``, ``otel-gpu metrics``.

Exit codes: 0 success; 1 ``check`` could read no GPU; 2 bad usage, bad
configuration, or NVML unavailable; 141 the reader of the output went away
(``otel-gpu check | head -1``), said by nothing. Every error is one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, NoReturn

from otel_gpu import __version__
from otel_gpu._log import configure as configure_logging
from otel_gpu._memory import return_freed_memory
from otel_gpu.config import CONFIG_ENV, OPTIONS, Config, Option, load, unknown_variables
from otel_gpu.errors import SetupError

if TYPE_CHECKING:
    from otel_gpu.sample.library import Nvml

log = logging.getLogger("otel_gpu")

EXIT_OK, EXIT_NO_GPU, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + int(signal.SIGPIPE)
"""141: what a shell reports for a tool that SIGPIPE stopped."""
STOP_DEADLINE_S = 5.0
"""A stop signal ends the process within this, whatever holds it (README: 5 seconds)."""
FIRST_SAMPLE_WAIT_S = 30.0
"""At most this long without cycle collection at start-up, waiting for the first sample."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors cut down to one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        _die(f"{message} (see otel-gpu --help)")


def _die(message: str) -> NoReturn:
    print(f"otel-gpu: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


class _HeldBack(logging.Filter):
    """Holds a handler's lines below WARNING back while the collector starts: a start that
    fails prints its one error line alone, and one that succeeds prints them all, in order.
    Warnings pass at once (they may say why the start fails)."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler
        self._lock = threading.RLock()  # re-entrant: a signal handler may log meanwhile
        self._held: list[logging.LogRecord] | None = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        with self._lock:
            if self._held is None:
                return True
            self._held.append(record)
            return False

    def release(self, *, emit: bool) -> None:
        """Print what was held (``emit``) or drop it; later lines pass at once."""
        with self._lock:  # another thread's line waits until the held ones are out
            held, self._held = self._held or [], None
            for record in held if emit else ():
                self.handler.acquire()
                try:  # the handler's other filters passed it already
                    self.handler.emit(record)
                finally:
                    self.handler.release()
        self.handler.removeFilter(self)


class _Starting:
    """The start-up's INFO lines, held back on every handler until :meth:`started`."""

    def __init__(self) -> None:
        self._holds = [_HeldBack(h) for h in logging.getLogger().handlers]
        for hold in self._holds:
            hold.handler.addFilter(hold)

    def started(self) -> None:
        for hold in self._holds:
            hold.release(emit=True)

    def failed(self) -> None:
        for hold in self._holds:
            hold.release(emit=False)


@contextlib.contextmanager
def _starting() -> Iterator[_Starting]:
    """Holds the INFO lines back until ``started()``; a start that fails before (an exit
    with its error line) drops them."""
    starting = _Starting()
    try:
        yield starting
    finally:
        starting.failed()  # nothing left to drop once started


def help_text(option: Option) -> str:
    """The row's help, its variable, and its default as the user would write it, once.

    A row whose help already says what its default is, or with no default
    (not set), names only the variable.
    """
    default = option.default
    if "default" in option.help or default is None or default == "":
        return f"{option.help} (${option.env})"
    shown = str(default).lower() if isinstance(default, bool) else str(default)
    return f"{option.help} (${option.env}; default {shown})"


def _common(parser: argparse.ArgumentParser, suppress: bool, *, check: bool = False) -> None:
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--config", metavar="FILE", default=default,
                        help=f"YAML configuration file (also ${CONFIG_ENV})")
    for option in OPTIONS:
        hidden = check and option.serve_only
        parser.add_argument(
            *option.flags, dest=option.key, metavar=option.metavar, default=default,
            help=argparse.SUPPRESS if hidden else help_text(option),
        )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="otel-gpu",
        description="OpenTelemetry-native NVIDIA GPU metrics collector.",
        epilog="Without a command, otel-gpu serves metrics (same as 'otel-gpu serve').",
    )
    parser.add_argument("--version", action="version", version=f"otel-gpu {__version__}")
    _common(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _common(sub.add_parser("serve", help="serve metrics (the default)"), suppress=True)
    checking = sub.add_parser("check", help="sample once and print every device's values",
                              description="Sample once and print every device's values. The "
                              "flags only a running service uses (listen addresses, "
                              "intervals, naming labels, OTLP pushing) are accepted and "
                              "checked, but not listed here.")
    _common(checking, suppress=True, check=True)
    checking.add_argument("--format", choices=("text", "json"), default="text",
                          help="text, or json: the same as one JSON document on stdout, "
                          "for scripts")
    metrics = sub.add_parser("metrics", help="list the metric catalog")
    metrics.add_argument("--format", choices=("text", "markdown", "migration"), default="text",
                         help="text; markdown (docs/metrics.md); migration (docs/migration.md)")
    return parser


def _config(args: argparse.Namespace) -> Config:
    flags = {o.key: getattr(args, o.key, None) for o in OPTIONS}
    try:
        return load(flags, config_file=getattr(args, "config", None))
    except SetupError as exc:
        _die(str(exc))


def _check_files(config: Config) -> None:
    """The service's checks of every file and option the settings name (``wiring.validate``).

    ``check`` calls it so that it refuses what ``serve`` would, and ``serve``
    before anything else, so that a bad file is the only line it prints.
    """
    from otel_gpu.wiring import validate

    try:
        validate(config, os.environ)
    except SetupError as exc:
        _die(str(exc))


def _open_nvml(config: Config) -> Nvml:
    from otel_gpu.sample.library import NvmlUnavailable
    from otel_gpu.wiring import open_nvml

    try:
        nvml = open_nvml(config.simulate)
        nvml.init()
    except SetupError as exc:
        _die(str(exc))
    except NvmlUnavailable as exc:
        _die(
            f"NVML could not be loaded: {exc}. Is the NVIDIA driver installed and "
            f"libnvidia-ml.so.1 visible? To run without a GPU: otel-gpu --simulate h100x8"
        )
    return nvml


DCGM_EXPORTER_PORT = 9400
"""dcgm-exporter's default port, which otel-gpu's default shares (docs/migration.md)."""


def listen_error(listen: tuple[str, int], exc: OSError) -> str:
    """The listener's error; on 9400 an address in use is most likely dcgm-exporter, still
    running on the node while migrating, so the line says which flag moves otel-gpu."""
    host, port = listen
    line = f"listen {host}:{port}: {exc.strerror or exc}"
    if exc.errno == errno.EADDRINUSE and port == DCGM_EXPORTER_PORT:
        line += (f" (dcgm-exporter's default port: if it still runs here, give otel-gpu "
                 f"another, e.g. --listen :{port + 1})")
    return line


def serve(config: Config) -> int:
    # Start-up makes a great many objects that live as long as the process (modules, the
    # catalog, the first snapshot): no cycle collection until the first sample is out,
    # then they are frozen out of every later collection's walk.
    gc.disable()
    return_freed_memory()
    from otel_gpu.wiring import Service

    logging.disable(logging.WARNING)  # what this pass would warn about, the service says once
    try:
        _check_files(config)
    finally:
        logging.disable(logging.NOTSET)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        if not stop.is_set():  # here, not after the wait: a main thread still starting
            # (or blocked in a call Python retries after the handler) never gets there
            _exit_by(STOP_DEADLINE_S - 0.6, EXIT_OK)  # the stacks' 0.5 s fit in the bound
        stop.set()

    with _starting() as starting:  # its INFO lines once the listeners are up, or never
        nvml = _open_nvml(config)
        try:
            service = Service(config, nvml)
        except SetupError as exc:
            _die(str(exc))
        except OSError as exc:
            _die(listen_error(config.listen, exc))
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGHUP, on_signal)  # a closed terminal or a HUP: stop, export
        service.start()
        starting.started()
    deadline = time.monotonic() + FIRST_SAMPLE_WAIT_S
    while (not stop.is_set() and time.monotonic() < deadline
           and service.pipeline.store.wait_for(1, timeout=0.1) is None):
        pass
    gc.freeze()
    gc.enable()
    while not stop.wait(3600):
        pass
    finished = threading.Event()

    def stop_service() -> None:
        service.stop()
        finished.set()

    threading.Thread(target=stop_service, daemon=True).start()
    if not finished.wait(STOP_DEADLINE_S - 1.0):
        log.warning("shutdown did not finish in time; exiting anyway")
    return EXIT_OK


def _exit_by(seconds: float, code: int) -> None:
    """End the process ``seconds`` from now if nothing else has: the bound on a stop.

    The service's own stop is bounded, but what runs after ``serve`` returns is not ours:
    a library's exit handler, a thread that is not a daemon, a log write into a full pipe.
    A pod that does not stop holds its node's rollout, so past the bound the thread
    stacks go to stderr (what held it, for the report) and the process ends without
    waiting for them.
    """
    def say() -> None:
        import faulthandler

        with contextlib.suppress(Exception):
            log.warning("the process did not end within %.0f s of the stop signal; "
                        "ending it now (thread stacks follow)", seconds)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)

    def watch() -> None:
        time.sleep(seconds)
        saying = threading.Thread(target=say, daemon=True)
        saying.start()
        saying.join(0.5)  # a stderr that does not drain holds the stacks, not the exit
        os._exit(code)

    threading.Thread(target=watch, daemon=True, name="otel-gpu-exit-deadline").start()


def check(config: Config, fmt: str = "text") -> int:
    """Sample once and print what was read: as text, or as one JSON document (``fmt``)."""
    from otel_gpu.wiring import sample_once

    with _starting() as starting:  # a driver that cannot load: its error line alone
        nvml = _open_nvml(config)
        starting.started()
    snapshot = sample_once(config, nvml)
    from otel_gpu.report import check_report, print_report  # check's alone

    report = check_report(snapshot)
    if fmt == "json":
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return EXIT_OK if snapshot.healthy_devices() else EXIT_NO_GPU


def _flags(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """Every flag of the parser and its commands -> whether it takes a value."""
    flags: dict[str, bool] = {}
    for action in parser._actions:
        flags.update((flag, action.nargs != 0) for flag in action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                flags.update(_flags(command))
    return flags


def _commands(parser: argparse.ArgumentParser) -> tuple[str, ...]:
    return next((tuple(action.choices) for action in parser._actions
                 if isinstance(action, argparse._SubParsersAction)), ())


def _did_you_mean(name: str, choices: Sequence[str], prefix: str = "") -> str:
    """`` (did you mean X?)`` for the closest choice, judged without the ``prefix`` all
    share (``--``: any two flags would look alike); empty when none is close."""
    tails = {choice.removeprefix(prefix): choice for choice in choices}
    import difflib  # a mistyped flag's alone

    close = difflib.get_close_matches(name.removeprefix(prefix), sorted(tails), n=1)
    return f" (did you mean {tails[close[0]]}?)" if close else ""


def refuse_unknown_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """One line for what argparse would misread, before it takes a value for the command
    (``--simualte h100x8``: "invalid choice: 'h100x8'"): an unknown ``--flag`` with the
    closest known one; another exporter's flag with otel-gpu's (config/foreign.py); a long
    flag written with one dash (``-simulate``); an unknown command with the closest one."""
    flags = _flags(parser)
    longs = sorted(flag for flag in flags if flag.startswith("--"))
    commands = _commands(parser)
    command_seen = False
    tokens = iter(argv)
    for token in tokens:
        if token == "--":
            return
        if not token.startswith("-") or token == "-" or token[1:2].isdigit():
            if not command_seen and token not in commands:
                _die(f"unknown command {token!r}{_did_you_mean(token, commands)} "
                     "(see otel-gpu --help)")
            command_seen = True
            continue
        name, eq, value = token.partition("=")
        if token[:2] in flags and not token.startswith("--"):  # -f, -fVALUE, -h
            if len(token) == 2 and flags[token]:
                next(tokens, None)  # its value, whatever it looks like
            continue
        # argparse takes a unique prefix (--sim) and says itself when one is ambiguous
        taken = [flag for flag in longs if flag.startswith(name)] if name.startswith("--") else []
        if taken:
            if not eq and any(flags[flag] for flag in taken):
                next(tokens, None)
            continue
        from otel_gpu.config.foreign import BY_FLAG  # a flag no exporter of ours takes

        foreign = BY_FLAG.get(name) or BY_FLAG.get("-" + name)  # Go flags take one dash too
        if foreign is not None:
            given = value if eq else None
            if not eq and foreign.takes_value:
                given = next(tokens, None)
            _die(foreign.hint(name, given))
        if name.startswith("--"):
            _die(f"unknown flag {name}{_did_you_mean(name, longs, '--')} (see otel-gpu --help)")
        as_long = "-" + name  # -simulate: one dash short of a long flag, or of its prefix
        meant = [flag for flag in longs if flag.startswith(as_long)] if len(name) > 2 else []
        if len(meant) == 1 or as_long in meant:
            _die(f"unknown flag {name} (did you mean {min(meant, key=len)}?)")
        close = _did_you_mean(as_long, longs, "--") if len(name) > 2 else ""
        _die(f"unknown flag {name}{close} (see otel-gpu --help)")


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for a reader that went away must not
    fail again (with a traceback) when the interpreter flushes it at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file (captured in tests): nothing to flush
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; a reader that goes away (``otel-gpu check | head -1``) ends it
    quietly with the status of a tool stopped by SIGPIPE, as Unix tools end."""
    try:
        try:
            return _main(sys.argv[1:] if argv is None else argv)
        finally:
            sys.stdout.flush()  # a reader that went away is met here, not at exit
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str]) -> int:
    # gRPC's C core logs connection chatter (a kubelet restart's GOAWAY) to stderr.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = build_parser()
    refuse_unknown_flags(parser, argv)
    args = parser.parse_args(argv)
    if args.command == "metrics":
        from otel_gpu.export import _docs

        render = {"markdown": _docs.markdown, "migration": _docs.migration}.get(
            args.format, _docs.text_table
        )
        sys.stdout.write(render())
        return EXIT_OK
    config = _config(args)
    configure_logging(config.log_level, config.log_format)
    for line in unknown_variables(os.environ):  # a typo'd key is an error; say a typo'd name
        log.warning("%s", line)
    if args.command == "check":
        _check_files(config)
        return check(config, args.format)
    return serve(config)
