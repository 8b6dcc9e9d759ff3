"""`autoshard batch`: solve many problem files, in parallel, incrementally, interruptibly.

`run_batch(inputs, out_dir)` expands `inputs` (files, directories searched recursively,
globs), solves every problem (in worker processes when `jobs > 1`) and writes, for each,
`<out>/<name>.json` (the `render.solution_record`, or an error record) and `<out>/<name>.md`
as soon as it finishes, then `<out>/summary.csv`.

- **Which files.** A file named on the command line is always a problem. Files found in a
  directory or by a glob (`*.yaml`, `*.yml`, `*.json`) are problems when they are a mapping
  with a top-level `model` key, or cannot be parsed at all (reported as bad input); other
  documents (what-if studies, catalogs, solution JSON) are skipped with a note. Hidden files
  and directories and the output directory are not searched. Symbolic links are followed
  once: a link back to an ancestor directory is reported as an input error, never walked.
  The same file reached twice (two links) is solved once.
- **Names.** `<name>` is the file's stem; stems that collide (`a/x.yaml`, `b/x.yaml`) become
  their paths relative to the colliding files' common directory with `/` spelled `__`
  (`a__x`, `b__x`). Names depend only on the set of files, never on the order given.
- **Incremental.** A problem whose `input_hash` (the file's bytes, the files it refers to,
  the autoshard version, `time_limit_s` and `top_k`) equals the `input_sha256` of its
  existing `<name>.json` is skipped (status `skipped-unchanged`) unless `force`, provided
  that record is intact: every record carries `record_sha256`, the hash of its own content,
  and a record edited since it was written (a valid JSON with another plan) is solved again.
- **Interruption.** SIGINT, or SIGTERM while the batch runs (a handler raising
  KeyboardInterrupt is installed and restored after), cancels what has not finished,
  stops the workers, writes `summary.csv` of what finished and re-raises. Outputs are
  written atomically: no partial or temporary files are left behind.
- **Executors.** `executor="local"` (default): in this process (`jobs` 1) or a process pool;
  `executor="dask"`: a Dask cluster (the scheduler at `scheduler`, else a LocalCluster of `jobs`
  workers started for the run) runs the same `solve_task` per problem and this process writes
  each record as it arrives, so the records are those of the local executor, the incremental
  skip and the interruption behave the same, and the workers need the problem files at the
  same paths (a shared filesystem; docs/calibration.md shows Slurm and Kubernetes set-ups).
- **Exit code** (`BatchResult.exit_code`): the largest over the problems: 0 solved, 1
  infeasible, 2 bad input (an input number too large for the solver's integers included), 3 an
  internal error (a bug: its record says so).
"""

from __future__ import annotations

import csv
import errno
import functools
import glob
import io
import multiprocessing
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from . import solver  # (looked up at call time: `autoshard.solver.solve` may be replaced)
from .errors import InfeasibleError, InputError, is_input_overflow
from .fileio import atomic_write, dumps_json, read_document, read_json_file, same_file
from .loader import file_folder, problem_paths, resolve_path
from .progress import TerminalLine
from .spec import DEFAULT_GAP_LIMIT
from .tables import Column, table_text
from .render import (
    error_markdown,
    error_record,
    fmt_num,
    fmt_pct,
    fmt_s,
    input_hash,
    record_exit_code,
    safe_name,
    solution_markdown,
    solution_record,
)
import hashlib
from .fileio import MAX_FILE_BYTES, read_limited
from .loader import load_problem, with_headroom
from .progress import status_text
from .render import strip_timing
from .dask_run import import_distributed, run_on_dask

PROBLEM_SUFFIXES = (".yaml", ".yml", ".json")
SUMMARY_NAME = "summary.csv"
# status: the outcome on file (optimal, feasible, infeasible, error); run: what this run did with it
# (solved, or skipped-unchanged: the record on file was kept).
SUMMARY_COLUMNS = ("name", "status", "run", "gpu", "num_gpus", "model", "step_time_s", "tokens_per_s", "mfu",
                   "peak_memory_gib", "plan", "solve_time_s", "input", "message")
STATUSES = ("optimal", "feasible", "infeasible", "error", "skipped-unchanged")

ProgressFn = Callable[[int, int, str, str], Any]


# =============================================================================================
# Results
# =============================================================================================


@dataclass
class ProblemResult:
    """One problem of a batch. `status`: what this run did (optimal, feasible, infeasible,
    error, skipped-unchanged); `result`: the outcome on file (the same, except that a skipped
    problem keeps its earlier optimal / feasible / infeasible / error)."""

    name: str
    path: str | None
    status: str
    result: str
    exit_code: int
    record: dict[str, Any]
    json_path: str
    md_path: str

    def row(self) -> dict[str, Any]:
        """The summary.csv row."""
        rec = self.record
        info = rec.get("problem") or {}
        est = rec.get("estimate") or {}
        err = rec.get("error") or {}
        return {
            "name": self.name, "status": self.result,
            "run": "skipped-unchanged" if self.status == "skipped-unchanged" else "solved",
            "gpu": info.get("gpu", ""), "num_gpus": info.get("num_gpus", ""), "model": info.get("model", ""),
            "step_time_s": est.get("step_time_s", ""), "tokens_per_s": est.get("tokens_per_s", ""),
            "mfu": est.get("mfu", ""), "peak_memory_gib": est.get("peak_memory_gib", ""),
            "plan": rec.get("plan_summary", ""), "solve_time_s": (rec.get("solver") or {}).get("solve_time_s", ""),
            "input": self.path or "", "message": err.get("message", ""),
        }


@dataclass
class BatchResult:
    out_dir: str
    problems: list[ProblemResult]  # sorted by name
    notes: list[str] = field(default_factory=list)  # files skipped while searching, duplicates, ...
    interrupted: bool = False
    total: int = 0  # problems found (more than len(problems) after an interruption)
    elapsed_s: float = 0.0

    @property
    def exit_code(self) -> int:
        """0 all solved, 1 some infeasible, 2 some bad input: the largest."""
        return max((p.exit_code for p in self.problems), default=0)

    @property
    def records(self) -> dict[str, dict[str, Any]]:
        return {p.name: p.record for p in self.problems}

    @property
    def summary_path(self) -> str:
        return str(Path(self.out_dir) / SUMMARY_NAME)

    def counts(self) -> dict[str, int]:
        c = Counter(p.status for p in self.problems)
        return {s: c[s] for s in STATUSES if c[s]}


# =============================================================================================
# Finding the problem files
# =============================================================================================


@dataclass(frozen=True)
class _Item:
    path: str  # as found (input-relative)
    error: str | None = None  # a problem with the input itself (loop, missing file): an input-error record


class _Finder:
    def __init__(self, exclude: str):
        self.exclude = exclude  # real path of the output directory
        self.items: list[_Item] = []
        self.notes: list[str] = []
        self.files: set[str] = set()  # real paths of files taken
        self.dirs: set[str] = set()  # real paths of directories walked
        self.errors: set[str] = set()

    def _under(self, real: str, top: str) -> bool:
        return real == top or real.startswith(top.rstrip(os.sep) + os.sep)

    def error(self, path: str, message: str) -> None:
        key = os.path.normpath(path)
        if key not in self.errors:
            self.errors.add(key)
            self.items.append(_Item(path, message))

    def input(self, inp: str) -> None:
        if os.path.lexists(inp):
            self.path(inp, explicit=True)
        elif glob.has_magic(inp):
            matches = sorted(glob.glob(inp, recursive=True))
            if not matches:
                self.notes.append(f"{inp}: no file matches")
            for m in matches:
                self.path(m, explicit=False)
        else:
            self.error(inp, "no such file or directory")

    def path(self, path: str, explicit: bool) -> None:
        try:
            st = os.stat(path)
        except OSError as exc:
            self._bad_stat(path, exc, explicit)
            return
        if stat.S_ISDIR(st.st_mode):
            self.walk(path)
        elif explicit or path.lower().endswith(PROBLEM_SUFFIXES):
            self.file(path, explicit)

    def _bad_stat(self, path: str, exc: OSError, explicit: bool) -> None:
        if exc.errno == errno.ELOOP:
            self.error(path, "symbolic link loop (the link resolves to itself)")
        elif os.path.islink(path):
            if explicit or path.lower().endswith(PROBLEM_SUFFIXES):
                self.error(path, f"broken symbolic link (to {os.readlink(path)})")
            else:
                self.notes.append(f"{path}: broken symbolic link, ignored")
        else:
            self.error(path, f"cannot read: {exc.strerror or exc}")

    def walk(self, root: str) -> None:
        """Depth-first, links followed once; a link to an ancestor is an error, never a hang."""
        real = os.path.realpath(root)
        if self._under(real, self.exclude):
            self.notes.append(f"{root}: the output directory, not searched")
            return
        if real in self.dirs:
            self.notes.append(f"{root}: already searched")
            return
        stack = [(root, real)]
        while stack:
            d, here = stack.pop()
            self.dirs.add(here)
            try:
                with os.scandir(d) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as exc:
                self.error(d, f"cannot list directory: {exc.strerror or exc}")
                continue
            subdirs: list[tuple[str, str]] = []
            for e in entries:
                if e.name.startswith("."):
                    continue
                try:
                    st = os.stat(e.path)
                except OSError as exc:
                    self._bad_stat(e.path, exc, explicit=False)
                    continue
                if stat.S_ISDIR(st.st_mode):
                    sub = os.path.realpath(e.path)
                    if e.is_symlink() and self._under(here, sub):
                        self.error(e.path, f"symbolic link loop: links to {sub}, a directory that contains it")
                    elif self._under(sub, self.exclude):
                        self.notes.append(f"{e.path}: the output directory, not searched")
                    elif sub in self.dirs:
                        self.notes.append(f"{e.path}: already searched (links to {sub})")
                    else:
                        self.dirs.add(sub)
                        subdirs.append((e.path, sub))
                elif not e.name.lower().endswith(PROBLEM_SUFFIXES):
                    continue
                elif not stat.S_ISREG(st.st_mode):  # a FIFO named *.yaml: reading it would block forever
                    self.notes.append(f"{e.path}: not a regular file (a FIFO, socket or device), skipped")
                else:
                    self.file(e.path, explicit=False)
            stack.extend(reversed(subdirs))

    def file(self, path: str, explicit: bool) -> None:
        real = os.path.realpath(path)
        if real in self.files:
            self.notes.append(f"{path}: the same file as one already found, solved once")
            return
        if not explicit:
            if self._under(real, self.exclude):
                return
            try:
                doc = read_document(path)
            except InputError:
                doc = {"model": None}  # cannot tell: report it as bad input rather than skip silently
            if not isinstance(doc, dict) or "model" not in doc:
                self.notes.append(f"{path}: not a problem file (no top-level `model`), skipped")
                return
        self.files.add(real)
        self.items.append(_Item(path))


def find_problems(inputs: Sequence[str | os.PathLike[str]], exclude: str | os.PathLike[str] | None = None
                  ) -> tuple[list[tuple[str, str, str | None]], list[str]]:
    """([(name, path, input error or None)], notes), sorted by path; names unique."""
    finder = _Finder(os.path.realpath(exclude) if exclude is not None else "\0")
    for inp in inputs:
        finder.input(os.fspath(inp))
    items = sorted(finder.items, key=lambda it: (os.path.normpath(it.path), it.error or ""))
    names = _names([it.path for it in items])
    return [(n, it.path, it.error) for n, it in zip(names, items)], finder.notes


def _names(paths: list[str]) -> list[str]:
    """Output names: the stem, or for colliding stems the path relative to the colliding
    files' common directory with `/` as `__`; a number is appended if that still collides."""
    stems = [safe_name(Path(p).stem) for p in paths]
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(stems):
        groups.setdefault(s.casefold(), []).append(i)
    names = list(stems)
    for idx in groups.values():
        if len(idx) < 2:
            continue
        absd = [os.path.abspath(paths[i]) for i in idx]
        try:
            common = os.path.commonpath([os.path.dirname(a) for a in absd])
        except ValueError:  # different drives
            common = ""
        rels = [os.path.relpath(a, common) if common else a for a in absd]
        cand = [safe_name(os.path.splitext(r)[0].replace(os.sep, "__")) for r in rels]
        if len({c.casefold() for c in cand}) < len(cand):  # x.yaml and x.json in one directory
            cand = [safe_name(r.replace(os.sep, "__").replace(".", "_")) for r in rels]
        for i, c in zip(idx, cand):
            names[i] = c
    used: set[str] = set()
    out = []
    for n in names:
        base, k = n, 2
        while n.casefold() in used:
            n, k = f"{base}-{k}", k + 1
        used.add(n.casefold())
        out.append(n)
    return out


# =============================================================================================
# Solving one problem (in a worker process or in-process)
# =============================================================================================


@dataclass(frozen=True)
class _Task:
    name: str
    path: str
    key: str | None
    time_limit_s: float
    top_k: int
    gap_limit: float = DEFAULT_GAP_LIMIT
    headroom_gib: float | None = None


def _settings(time_limit_s: float, top_k: int, gap_limit: float = DEFAULT_GAP_LIMIT,
              headroom_gib: float | None = None) -> dict[str, Any]:
    out = {"time_limit_s": float(time_limit_s), "top_k": int(top_k), "gap_limit": float(gap_limit)}
    if headroom_gib is not None:  # only when given: the hashes of earlier records stay valid
        out["headroom_gib"] = float(headroom_gib)
    return out


def input_key(path: str | os.PathLike[str], time_limit_s: float, top_k: int,
              gap_limit: float = DEFAULT_GAP_LIMIT, headroom_gib: float | None = None) -> str | None:
    """The incremental-skip hash of a problem file (None when it cannot be read): its bytes,
    the calibrated catalog / HF config files it names, the version and the solver settings.

    A named file counts by its path as written and its bytes, read where the solve reads it
    (relative to the problem file's folder): the hash does not depend on the working directory."""
    try:  # never more than the size limit (a 20 GiB file is an error record, not an out-of-memory)
        data = read_limited(path, MAX_FILE_BYTES)
    except InputError:
        return None
    extra: list[bytes] = []
    if b"catalog" in data or b"hf_config" in data:
        try:
            doc = read_document(path)
        except InputError:
            doc = None
        folder = file_folder(path)
        for _, ref in problem_paths(doc):
            if isinstance(ref, str):
                where = Path(resolve_path(ref, folder))
                if where.is_dir():  # an HF model folder: its config.json is what is read
                    where = where / "config.json"
                try:
                    extra.append(ref.encode() + b"\0" + read_limited(where, MAX_FILE_BYTES))
                except InputError:
                    extra.append(ref.encode() + b"\0(unreadable)")
    return input_hash(data, _settings(time_limit_s, top_k, gap_limit, headroom_gib), extra)


def record_problem_paths(record: dict[str, Any], problem_path: str | os.PathLike[str] | None) -> None:
    """Add the problem's absolute path (`abs_path`) to the record's `problem` section, next to
    `path` (relative to where it was solved), so `export` finds the problem from any directory."""
    info = record.get("problem")
    if isinstance(info, dict) and problem_path is not None:
        info["abs_path"] = os.path.abspath(problem_path)


def find_problem_file(info: dict[str, Any], record_path: str | os.PathLike[str]) -> str | None:
    """The problem file a record names: its `path` from here, its `abs_path`, or `path` from the
    record's folder and its parents (a solutions/ folder next to problems/, moved together)."""
    folder = Path(os.path.abspath(record_path)).parent
    candidates: list[Path] = []
    if info.get("path"):
        candidates.append(Path(str(info["path"])))
    if info.get("abs_path"):
        candidates.append(Path(str(info["abs_path"])))
    if info.get("path") and not os.path.isabs(str(info["path"])):
        candidates += [d / str(info["path"]) for d in (folder, *folder.parents)]
    for c in candidates:
        if c.is_file():
            return str(c)
    return None


def solve_task(task: _Task, on_event: Callable[[dict[str, Any]], None] | None = None) -> tuple[str, dict[str, Any], str]:
    """(name, record, markdown) of one problem; never raises (except KeyboardInterrupt).
    `on_event`: the solve's progress events (`autoshard.solve(progress=...)`)."""
    settings = _settings(task.time_limit_s, task.top_k, task.gap_limit, task.headroom_gib)
    common: dict[str, Any] = {"input_sha256": task.key, "settings": settings, "name": task.name}
    problem = None
    try:
        problem = with_headroom(load_problem(task.path), task.headroom_gib)
        sol = solver.solve(problem, time_limit_s=task.time_limit_s, top_k=task.top_k, gap_limit=task.gap_limit,
                    progress=on_event)
    except InputError as exc:
        rec = error_record(task.path, "input", exc.at(task.path).line(), problem=problem, **common)
    except InfeasibleError as exc:
        rec = error_record(task.path, "infeasible", exc.reason, exc.suggestions, problem=problem, **common)
    except Exception as exc:  # noqa: BLE001  (one broken problem must not sink the batch; reported in its record)
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        rec = error_record(task.path, "input" if is_input_overflow(exc) else "internal", msg, problem=problem, **common)
    else:
        rec = solution_record(task.path, problem, sol, **common)
        return task.name, rec, solution_markdown(problem, sol)
    return task.name, rec, error_markdown(rec)


def _worker_init() -> None:
    # Ctrl-C reaches the whole process group: the parent handles it and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _CpSatKeepsSigint().__enter__()  # for the life of the worker


class _CpSatKeepsSigint:
    """While active, CP-SAT solvers are created with `catch_sigint_signal = False`.

    By default CP-SAT installs its own SIGINT handler for each solve: Ctrl-C then only cuts
    that one CP-SAT search short (the KeyboardInterrupt is lost and the batch goes on), and
    after the solve SIGINT is left at the C default, so the next Ctrl-C kills the process
    without writing summary.csv. `solver.py` builds its `cp_model.CpSolver()` on use, so
    swapping the class for the batch's duration is enough. (A no-op once solver.py sets the
    parameter itself.)
    """

    def __init__(self) -> None:
        self.saved: Any = None

    def __enter__(self) -> "_CpSatKeepsSigint":
        try:
            from ortools.sat.python import cp_model  # noqa: PLC0415
        except ImportError:  # pragma: no cover - ortools is a dependency
            return self
        base = cp_model.CpSolver
        if getattr(base, "_autoshard_keeps_sigint", False):
            return self

        class CpSolver(base):  # type: ignore[misc, valid-type]
            _autoshard_keeps_sigint = True

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                try:
                    self.parameters.catch_sigint_signal = False
                except (AttributeError, ValueError):  # pragma: no cover - other ortools versions
                    pass

        CpSolver.__name__ = CpSolver.__qualname__ = base.__name__
        self.saved = (cp_model, base)
        cp_model.CpSolver = CpSolver  # type: ignore[misc]
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            cp_model, base = self.saved
            cp_model.CpSolver = base
            self.saved = None


# =============================================================================================
# The batch
# =============================================================================================


def _prepare_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Create the output directory and prove it writable, or raise InputError."""
    p = Path(out_dir)
    src = str(out_dir)
    if p.exists() and not p.is_dir():
        raise InputError("output path exists and is not a directory", source=src)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the output directory: {exc.strerror or exc}", source=src) from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".autoshard-write-test.", suffix=".tmp", dir=p)
        try:
            os.write(fd, b"ok")
        finally:
            os.close(fd)
            os.unlink(tmp)
    except OSError as exc:
        raise InputError(f"output directory is not writable: {exc.strerror or exc}", source=src) from None
    return p


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class _Signals:
    """SIGTERM raises KeyboardInterrupt while the batch runs (main thread only)."""

    def __init__(self) -> None:
        self.active = threading.current_thread() is threading.main_thread()
        self.saved: dict[int, Any] = {}

    def install(self) -> None:
        if self.active:
            self.saved[signal.SIGTERM] = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _raise_interrupt)

    def hold(self) -> dict[int, Any]:
        """Ignore SIGINT and SIGTERM (while writing the summary after an interrupt)."""
        held: dict[int, Any] = {}
        if self.active:
            for s in (signal.SIGINT, signal.SIGTERM):
                held[s] = signal.getsignal(s)
                signal.signal(s, signal.SIG_IGN)
        return held

    @staticmethod
    def put_back(saved: dict[int, Any]) -> None:
        for s, h in saved.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)

    def restore(self) -> None:
        self.put_back(self.saved)
        self.saved = {}


def _stop_pool(ex: ProcessPoolExecutor) -> None:
    """Cancel pending work and stop the workers now (they write nothing: the parent writes)."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    for p in procs:
        if p.is_alive():
            p.terminate()
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


def write_summary(out_dir: str | os.PathLike[str], problems: Iterable[ProblemResult]) -> str:
    """`<out>/summary.csv`, one row per problem sorted by name, written atomically."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(SUMMARY_COLUMNS), lineterminator="\n")
    w.writeheader()
    for p in sorted(problems, key=lambda p: p.name):
        w.writerow(p.row())
    path = Path(out_dir) / SUMMARY_NAME
    atomic_write(path, buf.getvalue())
    return str(path)


def _read_record(path: Path) -> dict[str, Any] | None:
    try:  # the bounded reader: a FIFO or a huge file in the output folder is no record (never a hang)
        rec = read_json_file(path, what="record")
    except InputError:
        return None
    return rec if isinstance(rec, dict) else None


RECORD_HASH_KEY = "record_sha256"


def record_digest(record: dict[str, Any]) -> str:
    """sha256 of a record's canonical JSON without its own `record_sha256` and the timing
    fields (`strip_timing`), so that the same solution gives the same digest on every run."""
    body = strip_timing({k: v for k, v in record.items() if k != RECORD_HASH_KEY})
    return hashlib.sha256(dumps_json(body).encode("utf-8")).hexdigest()


def seal_record(record: dict[str, Any]) -> dict[str, Any]:
    """The record with `record_sha256` set (what `batch` writes)."""
    record[RECORD_HASH_KEY] = record_digest(record)
    return record


def record_intact(record: dict[str, Any]) -> bool:
    """Whether a record is as `batch` wrote it (its `record_sha256` matches its content)."""
    return record.get(RECORD_HASH_KEY) == record_digest(record)


def _result_of(record: dict[str, Any]) -> str:
    st = str(record.get("status", ""))
    if st in ("optimal", "feasible", "infeasible"):
        return st
    return "error"


def _checked_args(inputs: Sequence[str | os.PathLike[str]] | str | os.PathLike[str], jobs: int, time_limit_s: float,
                  top_k: int, gap_limit: float, executor: str, scheduler: str | None,
                  ) -> tuple[Sequence[str | os.PathLike[str]], int]:
    """`run_batch`'s arguments checked (a one-line InputError before anything is written): the
    inputs as a sequence, and the number of worker processes (0: one per CPU)."""
    if executor not in ("local", "dask"):
        raise InputError(f"unknown executor {executor!r} (local, dask)", field="executor")
    if scheduler and executor != "dask":
        raise InputError("a scheduler address needs the dask executor", field="scheduler")
    if executor == "dask":
        import_distributed()  # a missing extra: one line, before anything is written
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not inputs:
        raise InputError("no input files or directories given")
    if jobs == 0:
        jobs = os.cpu_count() or 1
    if jobs < 0:
        raise InputError(f"jobs must be >= 0, got {jobs}", field="jobs")
    if not time_limit_s > 0:
        raise InputError(f"the time limit must be > 0 s, got {time_limit_s}", field="time_limit")
    if top_k < 0:
        raise InputError(f"top_k must be >= 0, got {top_k}", field="top")
    if not 0 <= gap_limit < 1:
        raise InputError(f"the gap limit must be a fraction in [0, 1), got {gap_limit}", field="gap")
    return inputs, jobs


def run_batch(inputs: Sequence[str | os.PathLike[str]] | str, out_dir: str | os.PathLike[str], *, jobs: int = 1,
              time_limit_s: float = 30, force: bool = False, top_k: int = 3, gap_limit: float = DEFAULT_GAP_LIMIT,
              progress: ProgressFn | None = None, headroom_gib: float | None = None, executor: str = "local",
              scheduler: str | None = None) -> BatchResult:
    """Solve every problem of `inputs` into `out_dir` (see the module docstring).

    `jobs`: worker processes (1: in this process; 0: one per CPU). `time_limit_s`, `top_k`,
    `gap_limit`: per solve (see `autoshard.solve`); `headroom_gib` (`--headroom`): HBM per GPU
    every plan leaves free, replacing each problem's `search.headroom_gib` (None: theirs). `progress(done, total, name, status)` is called once with (0, total, "", "")
    and after every problem (skipped ones included). Raises InputError before solving
    anything when `out_dir` is not writable, no problem file is found or an argument is
    out of range; re-raises KeyboardInterrupt (SIGINT, or SIGTERM during the batch) after
    writing summary.csv of what finished (the partial BatchResult is the exception's
    `batch_result` attribute).
    """
    t0 = time.perf_counter()
    inputs, jobs = _checked_args(inputs, jobs, time_limit_s, top_k, gap_limit, executor, scheduler)
    out = _prepare_out_dir(out_dir)
    found, notes = find_problems(list(inputs), exclude=out)
    if not found:
        raise InputError("no problem files found" + (f" ({'; '.join(notes[:3])})" if notes else ""),
                         source=", ".join(os.fspath(i) for i in inputs))
    total = len(found)
    done: dict[str, ProblemResult] = {}
    settings = _settings(time_limit_s, top_k, gap_limit, headroom_gib)
    if headroom_gib is not None and not (headroom_gib >= 0 and headroom_gib != float("inf")):
        raise InputError(f"must be a number of GiB >= 0, got {headroom_gib:g}", field="--headroom")

    def report(pr: ProblemResult) -> None:
        done[pr.name] = pr
        if progress:
            progress(len(done), total, pr.name, pr.status)

    def finish(name: str, path: str, record: dict[str, Any], md: str) -> None:
        jp, mp = out / f"{name}.json", out / f"{name}.md"
        record_problem_paths(record, path)
        try:
            atomic_write(jp, dumps_json(seal_record(record)))
            atomic_write(mp, md)
        except OSError as exc:  # this problem's record only: the batch goes on, the failure is its row
            where = exc.filename or (mp if Path(jp).is_file() else jp)
            message = f"{where}: cannot write the output: {exc.strerror or exc}"
            rec = error_record(path, "input", message, settings=record.get("settings"), name=name)
            report(ProblemResult(name, path, "error", "error", record_exit_code(rec), rec, str(jp), str(mp)))
            return
        res = _result_of(record)
        report(ProblemResult(name, path, res, res, record_exit_code(record), record, str(jp), str(mp)))

    sig = _Signals()
    sig.install()
    try:
        if progress:
            progress(0, total, "", "")
        tasks: list[_Task] = []
        inputs_found = [path for _, path, _ in found]
        for name, path, err in found:
            clash = next(((o, i) for o in (out / f"{name}.json", out / f"{name}.md") for i in inputs_found
                          if same_file(o, i)), None)
            if clash is not None:  # the output guard: a record never replaces an input (nothing written for it)
                message = (f"{clash[0]}: its record would replace the input {clash[1]}: "
                           "choose an output folder that holds no input")
                rec = error_record(path, "input", message, settings=settings, name=name)
                report(ProblemResult(name, path, "error", "error", record_exit_code(rec), rec, "", ""))
                continue
            if err is not None:
                rec = error_record(path, "input", f"{path}: {err}", settings=settings, name=name)
                finish(name, path, rec, error_markdown(rec))
                continue
            key = input_key(path, time_limit_s, top_k, gap_limit, headroom_gib)
            jp, mp = out / f"{name}.json", out / f"{name}.md"
            old = None if force or key is None else _read_record(jp)
            if (old is not None and old.get("input_sha256") == key and mp.is_file() and record_intact(old)
                    and (old.get("error") or {}).get("kind") != "internal"):
                report(ProblemResult(name, path, "skipped-unchanged", _result_of(old), record_exit_code(old), old,
                                     str(jp), str(mp)))
                continue
            tasks.append(_Task(name, path, key, float(time_limit_s), int(top_k), float(gap_limit), headroom_gib))
        if executor == "dask" and tasks:
            _run_dask(tasks, jobs, finish, scheduler)
        elif jobs <= 1 or len(tasks) <= 1:
            with _CpSatKeepsSigint():
                for t in tasks:
                    step = getattr(progress, "step", None)  # the bar advances within a problem too
                    name, rec, md = solve_task(t, functools.partial(step, t.name)) if callable(step) else solve_task(t)
                    finish(name, t.path, rec, md)
        else:
            _run_pool(tasks, jobs, finish)
    except KeyboardInterrupt as exc:
        result = BatchResult(str(out), sorted(done.values(), key=lambda p: p.name), notes, True, total,
                             time.perf_counter() - t0)
        held = sig.hold()
        try:
            write_summary(out, result.problems)
        finally:
            sig.put_back(held)
        exc.batch_result = result  # type: ignore[attr-defined]
        raise
    finally:
        sig.restore()
        close = getattr(progress, "close", None)
        if callable(close):
            close()
    result = BatchResult(str(out), sorted(done.values(), key=lambda p: p.name), notes, False, total,
                         time.perf_counter() - t0)
    write_summary(out, result.problems)
    return result


def _run_pool(tasks: list[_Task], jobs: int, finish: Callable[[str, str, dict[str, Any], str], None]) -> None:
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold solver threads
    ex = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx, initializer=_worker_init)
    try:
        futures = {ex.submit(solve_task, t): t for t in tasks}
        for fut in as_completed(futures):
            t = futures[fut]
            try:
                _, rec, md = fut.result()
            except Exception as exc:  # noqa: BLE001  (a worker died: killed, out of memory)
                rec = error_record(t.path, "internal", f"the worker process failed: {type(exc).__name__}: {exc}"[:500],
                                   input_sha256=t.key, settings=_settings(t.time_limit_s, t.top_k, t.gap_limit), name=t.name)
                md = error_markdown(rec)
            finish(t.name, t.path, rec, md)
    except BaseException:
        _stop_pool(ex)
        raise
    ex.shutdown(wait=True)


def _solve_task_on_worker(task: _Task) -> tuple[str, dict[str, Any], str]:
    """`solve_task` on a Dask worker, with CP-SAT leaving SIGINT alone (the client handles Ctrl-C)."""
    with _CpSatKeepsSigint():
        return solve_task(task)


def _run_dask(tasks: list[_Task], jobs: int, finish: Callable[[str, str, dict[str, Any], str], None],
              scheduler: str | None) -> None:
    """Solve the tasks on a Dask cluster (`dask_run.run_on_dask`: the scheduler at `scheduler`, else a
    LocalCluster of `jobs` single-threaded worker processes started for the run): each worker runs the
    same `solve_task` as the local pool and returns the record; this process writes it (atomically, as
    the local executor does) as each completes. The workers read the problem files (and the catalogs /
    HF configs they name) at the paths this process sees them: a shared filesystem. On an interrupt the
    pending tasks are cancelled, the client (and a cluster started here) closed; the records written stay."""

    def failed(t: _Task, exc: BaseException) -> tuple[str, dict[str, Any], str]:
        # a lost worker, autoshard missing on a worker: its record says so
        rec = error_record(t.path, "internal", f"dask: {type(exc).__name__}: {exc}".splitlines()[0][:500],
                           input_sha256=t.key, settings=_settings(t.time_limit_s, t.top_k, t.gap_limit,
                                                                  t.headroom_gib), name=t.name)
        return t.name, rec, error_markdown(rec)

    def finished(t: _Task, result: tuple[str, dict[str, Any], str]) -> None:
        _, rec, md = result
        finish(t.name, t.path, rec, md)

    run_on_dask(tasks, _solve_task_on_worker, jobs=jobs, scheduler=scheduler, key_prefix="autoshard-batch",
                on_result=finished, on_error=failed)


# =============================================================================================
# Terminal output
# =============================================================================================


class ProgressBar(TerminalLine):
    """`progress` callback drawing on stderr: one redrawn line on a TTY, else one line per
    finished problem. No dependencies."""

    def __init__(self, stream: TextIO | None = None, width: int = 24):
        super().__init__(stream)
        self.width = width
        self.counts: Counter[str] = Counter()
        self.last = (0, 0)  # (done, total) of the last call

    def step(self, name: str, event: dict[str, Any]) -> None:
        """Progress within the problem being solved (one of `solve`'s progress events): the TTY
        line shows its phase, configurations settled, incumbent, bound and gap; off a terminal,
        nothing (one line per finished problem stays the log)."""
        if not self.tty:
            return

        done, total = self.last
        self._draw(done, total, f"{name}: {status_text(event)}")

    def _line(self, done: int, total: int, text: str) -> str:
        """The TTY line: `\r`, the bar, done/total, seconds and `text`, cut and padded to the terminal."""
        fill = int(self.width * done / total) if total else self.width
        bar = "#" * fill + "." * (self.width - fill)
        line = f"[{bar}] {done}/{total} {time.monotonic() - self.t0:.0f}s"
        if text:
            line += f" {text}"
        cols = shutil.get_terminal_size((80, 24)).columns
        return "\r" + line[:max(10, cols - 1)].ljust(max(10, cols - 1))

    def _draw(self, done: int, total: int, text: str) -> None:
        line = self._line(done, total, text)
        try:
            self.stream.write(line)
            self.stream.flush()
        except (OSError, ValueError):
            return
        self.pending = True

    def __call__(self, done: int, total: int, name: str, status: str) -> None:
        self.last = (done, total)
        if name and status:
            self.counts[status] += 1
        try:
            if self.tty:
                self.stream.write(self._line(done, total, f"{name}: {status}" if name else ""))
                self.pending = True
                if total and done >= total:
                    self.stream.write("\n")
                    self.pending = False
            elif name:
                self.stream.write(f"[{done}/{total}] {name}: {status}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass


def summary_table(result: BatchResult) -> str:
    """The batch as a table (`tables.table_text`), one row per problem, then a totals line."""
    header = ["name", "status", "step time", "tokens/s", "MFU", "peak GiB", "plan / message"]
    rows = []
    for p in result.problems:
        rec = p.record
        est = rec.get("estimate") or {}
        status = p.status if p.status != "skipped-unchanged" else f"unchanged ({p.result})"
        if est:
            peak = f"{est.get('peak_memory_gib', 0):.1f}/{est.get('memory_capacity_gib', 0):.1f}"
            rows.append([p.name, status, fmt_s(est.get("step_time_s")), fmt_num(est.get("tokens_per_s")),
                         fmt_pct(est.get("mfu")), peak, rec.get("plan_summary", "")])
        else:
            msg = (rec.get("error") or {}).get("message", "")
            rows.append([p.name, status, "-", "-", "-", "-", msg if len(msg) <= 120 else msg[:117] + "..."])
    right = {2, 3, 4, 5}
    columns: list[Column] = [(h, "right") if i in right else h for i, h in enumerate(header)]
    out = table_text(columns, rows).splitlines()
    counts = ", ".join(f"{n} {s}" for s, n in result.counts().items())
    tail = f"{len(result.problems)} problem{'s' if len(result.problems) != 1 else ''}: {counts or 'none'}"
    if result.interrupted:
        tail += f" (interrupted: {result.total - len(result.problems)} not run)"
    tail += f"; exit code {result.exit_code}; outputs in {result.out_dir} ({SUMMARY_NAME})"
    out.append(tail)
    if result.notes:
        shown = result.notes[:5]
        out += [f"note: {n}" for n in shown]
        if len(result.notes) > len(shown):
            out.append(f"note: ... and {len(result.notes) - len(shown)} more")
    return "\n".join(out) + "\n"
