"""The error contract shared by every command-line tool.

Bad input raises `UserError` (or `ConfigError`, a subclass of ValueError) with a message that
names the problem and the fix. `cli_main` turns it into one line on stderr and exit code 2, with
no traceback unless `--debug` is on the command line.
"""
from __future__ import annotations

import argparse
import gzip
import json
import lzma
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """Bad input or an impossible request; the message says what to do."""


class ConfigError(ValueError):
    """A checkpoint or option that cannot be used; the message says what to do."""


def cli_main(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None,
             prog: str | None = None) -> int:
    """Run `main(argv)`; report user errors and interrupts on one line."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    prog = prog or getattr(main, "__module__", "ddtree_jax").replace(".__main__", "")
    try:
        return int(main(args) or 0)
    except (UserError, ConfigError) as e:
        if debug:
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted; nothing partial was left behind", file=sys.stderr)
        return EXIT_INTERRUPTED


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line through `cli_main` (exit 2), not usage + message."""

    def error(self, message: str):
        raise UserError(f"{message}; see {self.prog} --help")


def run_script(main: Callable[[Sequence[str] | None], int | None], prog: str) -> None:
    """`python -m` entry: like sys.exit(cli_main(...)), but a failed run exits at once, so that
    background threads of half-done work (e.g. an aborted checkpoint restore) cannot print more
    after the one-line error."""
    code = cli_main(main, prog=prog)
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def open_text(path: Path):
    """A text file, or an .xz / .gz compressed one, opened for reading as UTF-8."""
    if path.suffix == ".xz":
        return lzma.open(path, "rt", encoding="utf-8")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_text_file(path: str | Path, what: str, *, missing: str = "") -> str:
    """The text of `path`, or one UserError line: "{what} PATH not found{missing}" or "cannot
    read {what} PATH: reason"."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} not found{missing}")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {what} {path}: {e}") from None


def json_line_text(line: str, where: str, fields: tuple[str, ...] = ("prompt", "text")) -> str:
    """The first of `fields` that a JSONL line's object has, as a string; one UserError line naming
    `where` (e.g. "FILE:LINE") for a line that does not parse or has no such string field."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        raise UserError(f"{where} looks like JSON but does not parse; one text per line, or one JSON object "
                        f"with a \"{fields[0]}\" or \"{fields[1]}\" field per line") from None
    for name in fields:
        value = obj.get(name) if isinstance(obj, dict) else None
        if isinstance(value, str):
            return value
    raise UserError(f"{where} needs a string \"{fields[0]}\" or \"{fields[1]}\" field")


def read_json_file(path: str | Path, *, missing: str, invalid: str = "", error: type[Exception] = UserError) -> Any:
    """The JSON in `path`, or one line as `error`: "PATH not found; {missing}" or
    "PATH is not valid JSON (reason at line N){invalid}"."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path} not found; {missing}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise error(f"{path} is not valid JSON ({e.msg} at line {e.lineno}){invalid}") from None
    except UnicodeDecodeError as e:
        raise error(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}){invalid}") from None
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}{invalid}") from None
