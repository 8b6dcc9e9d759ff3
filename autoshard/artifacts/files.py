"""Bounded reads of artifact files: a regular file only, refused above a size limit before it is
read, decoded as UTF-8 (gzip-compressed traces decompressed up to the same limit); every error is
one line naming the file (and the line, where one is at fault), raised as `InputError` (exit 2)."""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from pathlib import Path

from ..errors import InputError
from ..fileio import read_limited

# Limits per kind of file (bytes). A training log of a long run is tens of MiB; a Chrome trace of a
# few profiled steps on one rank is tens to hundreds of MiB; nccl-tests output is a few KiB.
MAX_LOG_BYTES = 256 * 2**20
MAX_TRACE_BYTES = 512 * 2**20
MAX_NCCL_BYTES = 16 * 2**20
MAX_CONFIG_BYTES = 4 * 2**20


def at_line(path: str | os.PathLike[str], line: int | None, message: str) -> InputError:
    """`file:line: message` as an InputError (line None: the file as a whole)."""
    return InputError(message, source=f"{path}:{line}" if line else str(path))


def check_regular(path: str | os.PathLike[str]) -> None:
    """A regular file (a FIFO, a device or a directory is refused before it is opened)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", source=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InputError(f"{kind}: give a file", source=str(path))


def read_text(path: str | os.PathLike[str], limit: int, what: str = "file") -> str:
    """The text of a regular file of at most `limit` bytes (`.gz`: decompressed, at most `limit`)."""
    check_regular(path)
    raw = read_limited(path, limit, what=what)
    if str(path).endswith(".gz"):
        try:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            raw = d.decompress(raw, limit + 1)
        except (zlib.error, gzip.BadGzipFile, EOFError) as exc:
            raise InputError(f"not a gzip file: {exc}", source=str(path)) from None
        if len(raw) > limit:
            raise InputError(f"{what} decompresses to more than the {limit:,} bytes allowed", source=str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise at_line(path, line, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


def expand(inputs: list[str], patterns: tuple[str, ...], what: str) -> list[Path]:
    """Files named on the command line: a file as given, a directory -> its files matching
    `patterns` (sorted, not recursive). A name that does not exist is an error."""
    out: list[Path] = []
    for inp in inputs:
        p = Path(inp)
        if p.is_dir():
            found = sorted({q for pat in patterns for q in p.glob(pat) if q.is_file()})
            if not found:
                raise InputError(f"no {what} in the directory (looked for {', '.join(patterns)})", source=inp)
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            raise InputError("no such file or directory", source=inp)
    return out
