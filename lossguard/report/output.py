"""Where a command's output goes (stdout, or the file of `-o`), as one error boundary: a write
that fails there is the user's environment (a full disk, `> /dev/full`, `>&-`, `-o /proc/version`),
exit 2 with one line naming where, not an internal error. Python gives a failed write of stdout as
a bare OSError with no file name, and a closed stdout as `sys.stdout is None` (print() then writes
nothing, silently): neither can be told apart from a bug once it has left the write, so it is named
here, at the write. A reader that went away (`| head`) stays a BrokenPipeError: not an error."""

from __future__ import annotations

import errno
import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import OutputError

STDOUT = "<stdout>"


def write_failed(exc: OSError, where: str) -> Exception:
    """A failed write of the output as the CLI reports it: BrokenPipeError when the reader went
    away (the code may be only in the text: polars writes with Rust's I/O), else an OutputError."""
    if exc.errno == errno.EPIPE or isinstance(exc, BrokenPipeError):
        return BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))
    if exc.errno == errno.EBADF and where == STDOUT:
        return OutputError("cannot write the output: stdout is closed")
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    return OutputError(f"cannot write the output to {'stdout' if where == STDOUT else where}: {why}")


class _Stdout(io.RawIOBase):
    """File descriptor 1, whose write errors are OutputErrors. After the first failure (reported
    once) the rest is dropped: the interpreter's last flush at exit must not print a second
    message, or a traceback."""

    name = STDOUT

    def __init__(self) -> None:
        super().__init__()
        self._failed = False

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return os.isatty(1)

    def fileno(self) -> int:
        return 1  # (polars writes a table's bytes straight to it)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._failed:
            return len(data)
        try:
            return os.write(1, data)
        except OSError as exc:
            self._failed = True
            raise write_failed(exc, STDOUT) from None


@contextmanager
def guarded_stdout() -> Iterator[None]:
    """sys.stdout through `_Stdout` for the command's run, flushed inside it (a block-buffered
    stdout fails at the flush, after the command returned). Only the process's own stdout is
    replaced: one a caller put there (pytest's capture, a library user's StringIO) is left alone."""
    real = sys.stdout
    if real is not None and (real is not sys.__stdout__ or _descriptor(real) != 1):
        yield
        return
    if real is None:
        _hold_descriptor_1()
    stream = io.TextIOWrapper(
        io.BufferedWriter(_Stdout()),
        encoding=getattr(real, "encoding", None) or "utf-8",
        errors=getattr(real, "errors", None) or "strict",
        line_buffering=bool(getattr(real, "line_buffering", False)),
    )
    sys.stdout = stream
    try:
        yield
        stream.flush()
    finally:
        sys.stdout = real
        try:
            stream.flush()
        except (OSError, OutputError):
            pass  # (the failure that got here is the one reported)


def _descriptor(stream: object) -> int | None:
    try:
        return stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None


def _hold_descriptor_1() -> None:
    """A closed stdout (`>&-`): the next file opened (the state, a log) would get descriptor 1, and
    what is meant for stdout would be written into it. /dev/null opened read-only holds the place,
    and every write to it fails as a write to a closed descriptor does (EBADF), whoever writes."""
    fd = os.open(os.devnull, os.O_RDONLY)
    if fd != 1:
        os.dup2(fd, 1)
        os.close(fd)


def write_file(path: Path, text: str) -> None:
    """The report written to `path` (`-o`): a file that cannot be opened or written is named."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise write_failed(exc, str(path)) from None
