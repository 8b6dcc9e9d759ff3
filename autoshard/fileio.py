"""The ground floor of autoshard's file handling: every file it reads and every file it writes.

Nothing here imports more of autoshard than `errors`, so every module can use it.

Reading (`read_limited`, `read_text`, `read_document`, `read_json_file`): one bounded reader.
- The path must name a regular file: a missing file, a broken or looping symbolic link, a
  directory, a FIFO, a socket or a device (`/dev/zero`) is refused at once (one InputError
  line, exit 2), before anything is opened for reading; the file is opened non-blocking and
  checked again on the open descriptor, so a FIFO swapped in meanwhile cannot block either.
- The size is checked with fstat before a byte is read (a sparse 20 GiB file is refused at
  once) and at most `limit + 1` bytes are ever read.
- YAML is read with the safe loader only (`!!python/...` tags rejected, never executed), JSON
  without NaN/Infinity; a key given twice in one mapping is an error in both; documents nested
  deeper than MAX_DEPTH levels are an error (never a RecursionError).

Writing (`guard_output`, `atomic_write`): one output-path guard.
- `guard_output(path, inputs)` runs before any work: the output is never one of the command's
  inputs (same resolved path, or the same file by device and inode: a hard link, a symbolic
  link, `./p.yaml` vs `p.yaml`), never a directory, never under a regular file, and its folder
  must be writable.
- `atomic_write` writes a regular file through a temporary file in the same folder and a
  rename, so a reader (or a crash, or Ctrl-C) sees the old content or the new, never a part.
  A character device or a FIFO that a reader holds open (`/dev/null`, `/dev/stdout`) is written
  through and never replaced; a FIFO without a reader is an error, not a hang; a socket, a block
  device or a directory is refused.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError

# Size limits, checked with stat() before a byte is read (a sparse 20 GiB file is refused at once).
# JSON parses at ~100 MB/s; YAML's safe constructor at ~0.5 MB/s even with libyaml's parser, so its
# limit is smaller: the largest bundled problem or study is under 2 KB.
MAX_FILE_BYTES = 8 * 2**20   # JSON (problems, plans, solution records)
MAX_YAML_BYTES = 1 * 2**20   # YAML (problems, plans, studies, calibrated catalogs): parses in < 3 s
MAX_DEPTH = 100              # nesting levels of a document (no input of autoshard needs more than 6)


def check_input_file(path: str | os.PathLike[str], *, expected: str = "a problem file") -> os.stat_result:
    """The stat of `path` when it names a regular file; else one InputError line saying what it is
    instead (no such file, a broken or looping symbolic link, a directory, a FIFO, socket or device).
    Nothing is opened: a FIFO or `/dev/zero` is refused before any read could block or run forever."""
    src = os.fspath(path)
    try:
        st = os.stat(src)
    except OSError as exc:
        if os.path.islink(src):
            if exc.errno == errno.ELOOP:
                raise InputError("symbolic link loop (the link resolves to itself)", source=src) from None
            raise InputError(f"broken symbolic link (to {os.readlink(src)})", source=src) from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise InputError("no such file", source=src) from None
        raise InputError(f"cannot read: {exc.strerror or exc}", source=src) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"is a directory, expected {expected}", source=src)
    if not stat.S_ISREG(st.st_mode):  # reading could block forever (a FIFO) or never end (/dev/zero)
        raise InputError("not a regular file (a FIFO, socket or device)", source=src)
    return st


def read_limited(path: str | os.PathLike[str], limit: int, *, what: str = "file") -> bytes:
    """The bytes of a regular file (`check_input_file`), refused (one-line InputError) when larger
    than `limit`: the size is checked before reading, and at most `limit + 1` bytes are ever read
    (a file that grows, or /proc, cannot exhaust memory)."""
    src = os.fspath(path)
    expected = "a problem file" if what == "file" else ("an " if what[:1] in "aeiou" else "a ") + what
    check_input_file(src, expected=expected)
    try:
        fd = os.open(src, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO swapped in: no block
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise InputError("not a regular file (a FIFO, socket or device)", source=src)
            if st.st_size > limit:
                raise InputError(f"{what} is {st.st_size:,} bytes, larger than the {limit:,} allowed ({_mib(limit)})",
                                 source=src)
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", source=src) from None
    if len(raw) > limit:
        raise InputError(f"{what} is larger than the {limit:,} bytes allowed ({_mib(limit)})", source=src)
    return raw


def read_text(path: str | os.PathLike[str], limit: int, *, what: str = "file", empty_ok: bool = False) -> str:
    """`read_limited` decoded as UTF-8 (a leading byte-order mark is dropped); not UTF-8, or empty
    (unless `empty_ok`), is one InputError line."""
    src = os.fspath(path)
    raw = read_limited(src, limit, what=what)
    try:
        text = raw.decode("utf-8-sig")  # a leading byte-order mark (Windows editors) is not an error
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})", source=src) from None
    if not empty_ok and not text.strip():
        raise InputError("empty file", source=src)
    return text


def read_json_file(path: str | os.PathLike[str], limit: int = 0, *, what: str = "file") -> Any:
    """A JSON file through the bounded reader and the strict parser (`parse_json`)."""
    src = os.fspath(path)
    return parse_json(read_text(src, limit or MAX_FILE_BYTES, what=what), src)


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A key given twice in one YAML mapping (YAML 1.2 forbids it; PyYAML keeps the last)."""


class _DuplicateKeyCheck:
    """Constructor mix-in: a mapping that repeats a key is an error at the second key's line.
    Keys brought in by a merge (`<<: *base`) may be overridden, as YAML intends."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # complex keys: reported as non-text field names later
                key = self.construct_object(key_node, deep=False)  # type: ignore[attr-defined]
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue
                if first is not key_node:
                    where = f"line {first.start_mark.line + 1}" if first.start_mark else "before"
                    raise DuplicateKeyError(
                        None, None, f"duplicate key {key!r} (first given at {where}; YAML keys must be unique)",
                        key_node.start_mark)
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


class StrictSafeLoader(_DuplicateKeyCheck, yaml.SafeLoader):
    """yaml.SafeLoader that rejects duplicate keys (pure Python: the reference error messages)."""


_FastStrictLoader: type[yaml.SafeLoader | yaml.CSafeLoader]
if getattr(yaml, "__with_libyaml__", False):
    class _LibyamlStrictLoader(_DuplicateKeyCheck, yaml.CSafeLoader):
        """The same with libyaml's parser (4x faster); its errors are re-read with StrictSafeLoader."""
    _FastStrictLoader = _LibyamlStrictLoader
else:  # pragma: no cover - PyYAML built without libyaml
    _FastStrictLoader = StrictSafeLoader


def _depth_exceeds(data: Any, limit: int) -> bool:
    """Whether `data` nests containers more than `limit` deep (iterative; shared subtrees, as
    YAML aliases make, are visited once)."""
    best: dict[int, int] = {}
    stack = [(data, 1)]
    while stack:
        obj, depth = stack.pop()
        if not isinstance(obj, (dict, list)):
            continue
        if depth > limit:
            return True
        if best.get(id(obj), 0) >= depth:
            continue
        best[id(obj)] = depth
        stack.extend((v, depth + 1) for v in (obj.values() if isinstance(obj, dict) else obj))
    return False


def _yaml_error(exc: yaml.YAMLError, text: str, src: str | None) -> InputError:
    if isinstance(exc, yaml.reader.ReaderError):  # a control character such as NUL
        line = text.count("\n", 0, exc.position) + 1
        what = str(exc).splitlines()[0].strip()
        return InputError(f"YAML syntax error at line {line}: {what}", source=src)
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if isinstance(exc, DuplicateKeyError):
        return InputError(f"YAML error{where}: {what}", source=src)
    if "python/" in str(exc) or "could not determine a constructor" in str(exc):
        what = "YAML tags that construct Python objects are not allowed (" + str(what).strip() + ")"
    return InputError(f"YAML syntax error{where}: {what}", source=src)


def _nesting_error(source: str | None) -> InputError:
    return InputError(f"nested too deeply (more than {MAX_DEPTH} levels)", source=source)


def _too_deep(exc: yaml.YAMLError, source: str | None) -> None:
    """Newer PyYAML (6.0.4) stops a document nested past its own limit with a parser error (older
    releases recursed until RecursionError): raise that as the nesting error the loader gives."""
    if "maximum nesting depth" in str(exc):
        raise _nesting_error(source) from None


def parse_yaml(text: str, source: str | None = None) -> Any:
    """YAML text -> Python data with the safe loader (no Python tags), duplicate keys rejected
    at the line of the second one, nesting limited to MAX_DEPTH; any failure is one InputError."""
    try:
        data = yaml.load(text, Loader=_FastStrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        _too_deep(exc, source)
        try:  # the pure-Python parser words syntax errors better (and is the documented reference)
            yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506
        except yaml.YAMLError as exc2:
            _too_deep(exc2, source)
            raise _yaml_error(exc2, text, source) from None
        except RecursionError:
            pass
        raise _yaml_error(exc, text, source) from None
    except RecursionError:
        raise _nesting_error(source) from None
    if _depth_exceeds(data, MAX_DEPTH):
        raise _nesting_error(source)
    return data


def _no_duplicate_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r} (JSON object keys must be unique)")
        out[k] = v
    return out


def parse_json(text: str, source: str | None = None) -> Any:
    """JSON text -> Python data; duplicate keys, NaN/Infinity and deep nesting are InputErrors."""
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number in JSON")

    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_pairs, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}", source=source) from None
    except RecursionError:
        raise _nesting_error(source) from None
    except ValueError as exc:
        raise InputError(f"JSON error: {exc}", source=source) from None
    if _depth_exceeds(data, MAX_DEPTH):
        raise _nesting_error(source)
    return data


def read_document(path: str | os.PathLike[str]) -> Any:
    """Parse a YAML or JSON file into Python data, or raise a one-line InputError.

    Limits (checked before reading): JSON MAX_FILE_BYTES (8 MiB), YAML MAX_YAML_BYTES (1 MiB),
    MAX_DEPTH nesting levels; duplicate keys are errors in both; only regular files are read.
    """
    src = os.fspath(path)
    is_json = Path(src).suffix.lower() == ".json"
    text = read_text(src, MAX_FILE_BYTES if is_json else min(MAX_YAML_BYTES, MAX_FILE_BYTES))
    if is_json:
        return parse_json(text, src)
    return parse_yaml(text, src)


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write `data` (text as UTF-8, or bytes) to `path`; every command that writes a file uses this.

    - A regular file (new or existing) is written to a temporary file in the same folder and
      renamed over it, so that readers see the old content or the new, never a part; an existing
      file keeps its permissions, a new one follows the umask (mkstemp alone makes 0600).
    - A symbolic link is written through: the file it points to is replaced as above (a dangling
      link creates its target), the link itself stays.
    - A character device or named pipe (`/dev/null`, `/dev/stdout`, a FIFO a reader holds open)
      is written through, never replaced; a FIFO without a reader is an error, not a hang.
    - Anything else (a socket, a block device, a directory) is refused.
    Failures raise OSError (with `strerror`); callers turn it into one line, exit 2.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    target = os.fspath(path)
    if not target:
        raise OSError(errno.ENOENT, "empty output path")
    try:
        st = os.stat(target)  # follows symbolic links
    except FileNotFoundError:
        st = None
    stream = _same_as_std_stream(st)
    if stream is not None:  # `-o /dev/stdout` (a terminal, a pipe or `> file`): in order with what else is printed
        stream.flush()
        stream.buffer.write(raw)
        stream.flush()
        return
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_through(target, st, raw)
        return
    if st is not None and os.path.abspath(target).startswith(("/dev/", "/proc/")):
        # /dev/fd/N and the like: the file is held open elsewhere; renaming over it would lose the output
        with open(target, "wb") as fh:
            fh.write(raw)
        return
    if os.path.islink(target):
        target = os.path.realpath(target)  # replace the file the link names, keep the link
    p = Path(target)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:120]}.", suffix=".tmp", dir=p.parent)  # a 255-byte name fits
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        if st is not None:
            mode = stat.S_IMODE(st.st_mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def check_output_file(path: str | os.PathLike[str], field: str = "--output") -> None:
    """Fail before any work when `path` cannot be written as a file (an InputError line):
    an empty name, a directory, a folder on the way that is a file, a read-only folder or
    file system. Device files and named pipes pass (they are written through)."""
    target = os.fspath(path)
    if not target:
        raise InputError("must be a file name, got an empty string", field=field)
    p = Path(target)
    if p.is_dir():
        raise InputError("is a directory, expected an output file name", source=target, field=field)
    if p.exists():
        if not os.access(p, os.W_OK):
            raise InputError("cannot write: the file is not writable", source=target, field=field)
        if not p.is_file():
            return
    folder = Path(os.path.realpath(p)).parent
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"cannot write here: {probe} is not a directory", source=target, field=field)
    if not os.access(probe, os.W_OK | os.X_OK):
        why = "is on a read-only file system" if _read_only_fs(probe) else "is not writable"
        raise InputError(f"cannot write here: {probe} {why}", source=target, field=field)


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def _same_as_std_stream(st: os.stat_result | None) -> Any:
    """sys.stdout or sys.stderr when `st` is the file they write to (else None)."""
    if st is None:
        return None
    for stream in (sys.stdout, sys.stderr):
        try:
            own = os.fstat(stream.fileno())
        except (OSError, ValueError, AttributeError):  # replaced by a StringIO (tests), closed
            continue
        if (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino) and hasattr(stream, "buffer"):
            return stream
    return None


def _write_through(target: str, st: os.stat_result, raw: bytes) -> None:
    """Write into an existing character device or FIFO (never replace it)."""
    if stat.S_ISDIR(st.st_mode):
        raise OSError(errno.EISDIR, "is a directory")
    if stat.S_ISFIFO(st.st_mode):
        try:  # non-blocking open: a FIFO nobody reads would otherwise hang here forever
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                raise OSError(errno.ENXIO, "named pipe with no reader") from None
            raise
        os.set_blocking(fd, True)
    elif stat.S_ISCHR(st.st_mode):
        fd = os.open(target, os.O_WRONLY)
    else:
        kind = "socket" if stat.S_ISSOCK(st.st_mode) else "block device" if stat.S_ISBLK(st.st_mode) else "special file"
        raise OSError(errno.EINVAL, f"not a regular file (a {kind}); refusing to write to it")
    with os.fdopen(fd, "wb") as fh:
        fh.write(raw)
        fh.flush()


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file: the same resolved path (symbolic links followed, `./x`
    and `x` alike), or the same device and inode (a hard link, a bind mount)."""
    try:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def guard_output(path: str | os.PathLike[str], inputs: Iterable[Any] = (), *, field: str = "--output") -> None:
    """The output-path guard every command that writes a file runs before any work (one InputError
    line, exit 2, nothing written):
    - the output is none of `inputs` (the files the command reads: compared by `same_file`), so
      `solve p.yaml -o p.yaml` cannot replace the problem with its solution;
    - it is not a directory, not under a regular file, and its folder (or the nearest existing
      one) is writable (`check_output_file`);
    - an existing output that is not a regular file is written through only when it is a
      character device or a FIFO (`atomic_write`); anything else is refused here.
    `inputs` may hold None and non-path values (skipped)."""
    target = os.fspath(path)
    check_output_file(target, field)
    for src in inputs:
        if isinstance(src, (str, os.PathLike)) and os.fspath(src) and same_file(target, src):
            raise InputError(f"is also an input of this command ({os.fspath(src)}): writing the output there "
                             "would replace the input; choose another output name", source=target, field=field)
    try:
        st = os.stat(target)
    except OSError:
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        kind = "socket" if stat.S_ISSOCK(st.st_mode) else "block device" if stat.S_ISBLK(st.st_mode) else "special file"
        raise InputError(f"not a regular file (a {kind}); refusing to write to it", source=target, field=field)


def dumps_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, 2-space indent, trailing newline (byte-stable)."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
