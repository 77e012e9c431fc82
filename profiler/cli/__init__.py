"""The `profiler` command line.

Commands are listed explicitly in COMMANDS (name -> module).  A command module
exposes `add_parser(subparsers) -> argparse.ArgumentParser` and
`run(args) -> int`, and keeps heavy imports (pandas, pyarrow, plotly) inside
`run`, so that building the parser stays cheap.  Adding a command is one line
in COMMANDS.

Bad input raises profiler.errors.ProfilerError; main() prints it as one line,
`profiler: error: <file>: <what is wrong>`, and returns 2.  Usage errors
(unknown option, bad value) are one line too, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from profiler._version import __version__
from profiler.errors import ProfilerError

COMMANDS: dict[str, str] = {
    "summarize": "profiler.cli.summarize",
    "merge": "profiler.cli.merge",
    "preload": "profiler.cli.preload",
    "bench": "profiler.cli.bench",
    "report": "profiler.cli.report",
    "compare": "profiler.cli.compare",
    "export": "profiler.cli.export",
    "synth": "profiler.cli.synth",
    "tensors": "profiler.cli.tensors",
    "advise": "profiler.cli.advise",
    "check": "profiler.cli.check",
    "hang": "profiler.cli.hang",
    "watch": "profiler.cli.watch",
    "jobs": "profiler.cli.jobs",
    "predict": "profiler.cli.predict",
}

EXIT_OK = 0
EXIT_BAD_INPUT = 2


class UsageExit(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the CLI convention) instead of usage dumps."""

    def error(self, message: str) -> NoReturn:
        raise UsageExit(" ".join(message.split()))


def error_line(message: str) -> str:
    return f"profiler: error: {message}"


def build_parser() -> Parser:
    parser = Parser(prog="profiler",
                    description="horovod-profiler: communication profiler for Horovod jobs")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", parser_class=Parser)
    for module_name in COMMANDS.values():
        module: Any = importlib.import_module(module_name)
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


def warning_line(message: object) -> str:
    from profiler.errors import printable

    return f"profiler: warning: {printable(' '.join(str(message).split()))}"


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """Warnings from the library as one line each, `profiler: warning: ...`, never the
    source line, never a control character from a name or a path in the file."""
    print(warning_line(message), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        args = parser.parse_args(args_list)
        if getattr(args, "_run", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_BAD_INPUT
        return int(args._run(args) or 0)
    except UsageExit as exc:
        print(error_line(exc.message), file=sys.stderr)
        return EXIT_BAD_INPUT
    except ProfilerError as exc:
        print(error_line(exc.line()), file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        sys.stdout = None  # type: ignore[assignment]
        return EXIT_OK
    except KeyboardInterrupt:
        print("profiler: interrupted", file=sys.stderr)
        return 130
