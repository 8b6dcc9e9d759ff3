"""Reading problems and plans (YAML, JSON or dicts) and writing files atomically.

Every failure becomes one `InputError` line: `file: field.path: what is wrong`.
YAML is read with the safe loader only: tags such as `!!python/object` are
rejected, never executed.

Paths inside a file (`model.hf_config`, `cluster.catalog`; in a what-if study
`workloads[].model.hf_config` and `options[].catalog`) are resolved against the
folder of that file (symbolic links followed), like docker-compose or tsconfig,
so that a problem works from any working directory; absolute paths are kept. A
problem given as a dict has no file: its paths are read against the working
directory, when used.
"""

from __future__ import annotations

import errno
import json
import math
import os
import reprlib
import stat
import sys
import tempfile
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import InputError, closest
from .spec import UNPLANNABLE_SCHEDULES, Plan, Problem

M = TypeVar("M", bound=BaseModel)

# Size limits, checked with stat() before a byte is read (a sparse 20 GiB file is refused at once).
# JSON parses at ~100 MB/s; YAML's safe constructor at ~0.5 MB/s even with libyaml's parser, so its
# limit is smaller: the largest bundled problem or study is under 2 KB.
MAX_FILE_BYTES = 8 * 2**20   # JSON (problems, plans, solution records)
MAX_YAML_BYTES = 1 * 2**20   # YAML (problems, plans, studies, calibrated catalogs): parses in < 3 s
MAX_DEPTH = 100              # nesting levels of a document (no input of autoshard needs more than 6)
# Tokens per training step (global_batch_size sequences x seq_len) above which a batch is taken for a
# unit mistake (tokens given as sequences): 1e9 is 60x the largest published batch (Llama 3 405B: 16M
# tokens), and far past it the solver's integer model would overflow.
MAX_TOKENS_PER_STEP = 1e9


def read_limited(path: str | os.PathLike[str], limit: int, *, what: str = "file") -> bytes:
    """The bytes of a regular file, refused (one-line InputError) when larger than `limit`:
    the size is checked before reading, and at most `limit + 1` bytes are ever read (a file
    that grows, or /proc, cannot exhaust memory)."""
    src = str(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > limit:
                raise InputError(f"{what} is {size:,} bytes, larger than the {limit:,} allowed ({_mib(limit)})",
                                 source=src)
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", source=src) from None
    if len(raw) > limit:
        raise InputError(f"{what} is larger than the {limit:,} bytes allowed ({_mib(limit)})", source=src)
    return raw


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A key given twice in one YAML mapping (YAML 1.2 forbids it; PyYAML keeps the last)."""


class _DuplicateKeyCheck:
    """Constructor mix-in: a mapping that repeats a key is an error at the second key's line.
    Keys brought in by a merge (`<<: *base`) may be overridden, as YAML intends."""

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
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


if getattr(yaml, "__with_libyaml__", False):
    class _FastStrictLoader(_DuplicateKeyCheck, yaml.CSafeLoader):  # type: ignore[misc, name-defined]
        """The same with libyaml's parser (4x faster); its errors are re-read with StrictSafeLoader."""
else:  # pragma: no cover - PyYAML built without libyaml
    _FastStrictLoader = StrictSafeLoader  # type: ignore[misc]


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
    MAX_DEPTH nesting levels; duplicate keys are errors in both.
    """
    p = Path(path)
    src = str(path)
    if not p.exists():
        if p.is_symlink():
            try:
                os.stat(p)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise InputError("symbolic link loop (the link resolves to itself)", source=src) from None
            raise InputError(f"broken symbolic link (to {os.readlink(p)})", source=src)
        raise InputError("no such file", source=src)
    if p.is_dir():
        raise InputError("is a directory, expected a problem file", source=src)
    if not p.is_file():  # a FIFO, socket or device: reading could block forever
        raise InputError("not a regular file (a FIFO, socket or device)", source=src)
    is_json = p.suffix.lower() == ".json"
    raw = read_limited(p, MAX_FILE_BYTES if is_json else min(MAX_YAML_BYTES, MAX_FILE_BYTES))
    try:
        text = raw.decode("utf-8-sig")  # a leading byte-order mark (Windows editors) is not an error
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})", source=src) from None
    if not text.strip():
        raise InputError("empty file", source=src)
    if is_json:
        return parse_json(text, src)
    return parse_yaml(text, src)


def file_folder(path: str | os.PathLike[str]) -> str:
    """The folder that relative paths inside the file at `path` are resolved against:
    the file's own folder, symbolic links followed (absolute)."""
    return os.path.dirname(os.path.realpath(path))


def resolve_path(ref: Any, folder: str | os.PathLike[str] | None) -> Any:
    """A path named inside a file, made absolute against that file's folder (`file_folder`).

    Absolute paths, empty strings and values that are not text (reported by validation)
    are returned unchanged, and so is everything when `folder` is None (no file: the
    path is read against the working directory when used).
    """
    if folder is None or not isinstance(ref, str) or not ref or os.path.isabs(ref):
        return ref
    return os.path.join(os.fspath(folder), ref)


# The paths a problem document names: (section, key).
PROBLEM_PATH_FIELDS = (("model", "hf_config"), ("cluster", "catalog"))


def problem_paths(data: Any) -> list[tuple[str, Any]]:
    """[(field path, value)] of the paths a problem document names (`model.hf_config`,
    `cluster.catalog`), as written."""
    out = []
    if isinstance(data, Mapping):
        for section, key in PROBLEM_PATH_FIELDS:
            sub = data.get(section)
            if isinstance(sub, Mapping) and key in sub:
                out.append((f"{section}.{key}", sub[key]))
    return out


def resolve_problem_paths(data: Any, folder: str | os.PathLike[str] | None) -> Any:
    """A problem document with its relative `model.hf_config` and `cluster.catalog` made
    absolute against `folder` (see `resolve_path`); anything else unchanged."""
    if folder is None or not isinstance(data, Mapping):
        return data
    out = dict(data)
    for section, key in PROBLEM_PATH_FIELDS:
        sub = out.get(section)
        if isinstance(sub, Mapping) and key in sub:
            out[section] = {**sub, key: resolve_path(sub[key], folder)}
    return out


def named_file_error(exc: InputError, source: str | None, field: str) -> InputError:
    """An error in a file that `source` names at `field` (a calibrated catalog, a Hugging
    Face config.json), as one line naming both: `source: field: named file: its field: what`.
    An error without a file of its own is attributed to `source` as it is."""
    if not exc.source or exc.source == source:
        return exc.at(source)
    return InputError(exc.message, source=": ".join(p for p in (source, field, exc.source) if p), field=exc.field)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 60, 60


def _short_repr(value: Any) -> str:
    """repr() bounded in time and length (inputs may be huge or share structure: YAML aliases)."""
    return _REPR.repr(value)


def _is_union_tag(item: Any) -> bool:
    """pydantic's name of a union member in an error location (`int`, `list[int]`, `literal[...]`)."""
    return isinstance(item, str) and ("[" in item or item in ("int", "str", "bool", "float", "none")
                                      or item[:1].isupper())


def _model_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The schema class whose fields are valid at `loc` (None when it cannot be told)."""
    cls = model
    for item in loc:
        if cls is None:
            return None
        if isinstance(item, int) or _is_union_tag(item):
            continue
        info = cls.model_fields.get(str(item))
        if info is None:
            return None
        cls = _find_model(info.annotation)
    return cls


def _find_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _find_model(arg)
        if found is not None:
            return found
    return None


def format_validation_error(exc: ValidationError, model: type[BaseModel] | None = None) -> tuple[str, str]:
    """(field path, message) of the most useful error of a pydantic ValidationError.

    An unknown field (a typo) is reported before the required field it was meant to be,
    with the closest valid names; of the members of a union (`int | list[int]`) the one
    that got furthest into the input is reported, and the member names are left out of
    the path.
    """
    errors = exc.errors(include_url=False)
    extra = [e for e in errors if e["type"] == "extra_forbidden"]
    err = extra[0] if extra else errors[0]
    loc = tuple(x for x in err["loc"] if not str(x).startswith("function-"))
    tag = next((i for i, x in enumerate(loc) if _is_union_tag(x)), None)
    if tag is not None and not extra:
        prefix = loc[:tag]
        siblings = [e for e in errors
                    if tuple(x for x in e["loc"] if not str(x).startswith("function-"))[:tag] == prefix]
        err = max(siblings, key=lambda e: len(e["loc"]))  # first of the longest: the most specific
        loc = tuple(x for x in err["loc"] if not str(x).startswith("function-"))
    # The last item of an unknown-field location is the user's key, whatever it looks like.
    kept = [x for x in loc[:-1] if not _is_union_tag(x)] + [loc[-1]] if err["type"] == "extra_forbidden" else \
        [x for x in loc if not _is_union_tag(x)]
    path = ".".join(str(x) for x in kept)
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
        cls = _model_at(model, loc[:-1])
        if cls is not None:
            msg += f" ({closest(str(loc[-1]), cls.model_fields)})"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif "input" in err and err["type"] not in ("value_error", "assertion_error"):
        msg = f"{msg} (got {_short_repr(err['input'])})"[:300]
    msg = msg.removeprefix("Value error, ")
    return path, msg


def validate(model: type[M], data: Any, *, source: str | None = None, root: str = "") -> M:
    """Build a pydantic model from data, turning failures into one-line InputErrors."""
    if not isinstance(data, Mapping):
        kind = "empty document" if data is None else f"a {type(data).__name__}"
        raise InputError(f"expected a mapping of fields, got {kind}", source=source, field=root or None)
    odd = next((k for k in data if not isinstance(k, str)), None)
    if odd is not None:
        raise InputError(f"field names must be text, got {_short_repr(odd)}", source=source, field=root or None)
    try:
        return model(**data)
    except InputError as exc:  # raised while resolving presets / hf_config
        raise exc.at(source) from None
    except ValidationError as exc:
        loc, msg = format_validation_error(exc, model)
        field = ".".join(x for x in (root, loc) if x)
        raise InputError(msg, source=source, field=field or None) from None
    except (TypeError, ValueError) as exc:
        raise InputError(str(exc).splitlines()[0], source=source, field=root or None) from None


def load_problem(source: str | os.PathLike[str] | Mapping[str, Any] | Problem) -> Problem:
    """A `Problem` from a YAML/JSON path, a dict, or a Problem (returned as is).

    A problem file may carry a `plan:` section (used by `autoshard evaluate` when no
    `--plan` is given); it is ignored here.
    """
    if isinstance(source, Problem):
        return source
    if isinstance(source, Mapping):
        data, src = dict(source), None
    elif isinstance(source, (str, os.PathLike)):
        data, src = read_document(source), str(source)
        data = resolve_problem_paths(data, file_folder(source))  # relative to the file, not the working directory
    else:  # already-parsed data that is not a mapping (a list, a number, None): reported by validate
        data, src = source, None
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k != "plan"}
        if "model" not in data and ("model_type" in data or "architectures" in data):
            raise InputError("this is a Hugging Face config.json, not a problem file: pass it with --hf-config, "
                             "or as `model: {hf_config: PATH}` in a problem file", source=src, field="model")
        if "model" in data and all(isinstance(k, str) for k in data):
            from .catalog import resolve_model  # noqa: PLC0415

            try:  # here rather than in Problem's validator, so that an error in the config.json names both files
                data["model"] = resolve_model(data["model"])
            except InputError as exc:
                raise named_file_error(exc, src, "model.hf_config") from None
    problem = validate(Problem, data, source=src)
    from .topology import check_cluster  # noqa: PLC0415

    try:
        check_cluster(problem)
        check_batch(problem)
        check_catalog(problem)
        check_search(problem)
        _check_headroom(problem)
    except InputError as exc:  # one with a file of its own is in the calibrated catalog the problem names
        raise named_file_error(exc, src, "cluster.catalog") from None
    return problem


def _count(x: float) -> str:
    """`16.4B`, `1.2M`, `977`: a token count in a message."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if x >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:,.0f}"


def check_batch(problem: Problem) -> None:
    """A step of more than MAX_TOKENS_PER_STEP tokens is a batch given in tokens rather than in
    sequences: bad input naming the sequences it probably meant."""
    t = problem.training
    tokens = t.global_batch_size * t.seq_len
    if tokens > MAX_TOKENS_PER_STEP:
        meant = max(1, round(t.global_batch_size / t.seq_len))
        shown = _count(tokens) if _count(tokens) != _count(MAX_TOKENS_PER_STEP) else f"{tokens:,}"
        raise InputError(f"{t.global_batch_size:,} sequences x {t.seq_len} tokens = {shown} tokens per step, "
                         f"more than the {_count(MAX_TOKENS_PER_STEP)} allowed; global_batch_size counts sequences "
                         f"(did you mean {meant}?)", field="training.global_batch_size")


def check_catalog(problem: Problem) -> None:
    """A calibrated catalog (`cluster.catalog`) must hold an entry for the cluster's GPU: an
    overlay that names other GPUs would be silently ignored."""
    path = problem.cluster.catalog
    if not path:
        return
    from .catalog import _aliases, _norm, load_overlay  # noqa: PLC0415

    overlay = load_overlay(path)
    gid = _aliases().get(_norm(problem.cluster.gpu), problem.cluster.gpu)
    if gid not in overlay:
        raise InputError(f"the calibrated catalog {path} has no entry for {gid} (it has: {', '.join(sorted(overlay))}): "
                         "its factors would not apply", field="cluster.catalog")


def with_headroom(problem: Problem, headroom_gib: float | None, option: str = "--headroom") -> Problem:
    """The problem with `search.headroom_gib` set from a command-line option (None: unchanged);
    a value that is negative, not finite or leaves no memory is bad input naming the option."""
    if headroom_gib is None:
        return problem
    import math  # noqa: PLC0415

    if not (math.isfinite(headroom_gib) and headroom_gib >= 0):
        raise InputError(f"must be a number of GiB >= 0, got {headroom_gib:g}", field=option)
    search = problem.search.model_copy(update={"headroom_gib": float(headroom_gib)})
    out = problem.model_copy(update={"search": search})
    try:
        _check_headroom(out)
    except InputError as exc:
        raise InputError(exc.message, field=option) from None
    return out


def _check_headroom(problem: Problem) -> None:
    """The headroom must leave some HBM for the plan (else every plan fails: bad input, not infeasible)."""
    head = problem.search.headroom_gib
    if not head:
        return
    from .catalog import get_gpu  # noqa: PLC0415

    gpu = get_gpu(problem.cluster.gpu, problem.cluster.catalog)
    usable = gpu.hbm_bytes / 2**30 - 2.0  # less the reserve (cost.RESERVE_GIB)
    if head >= usable:
        raise InputError(f"a headroom of {head:g} GiB leaves nothing of the {usable:.1f} GiB a {gpu.id} offers "
                         "after the 2 GiB reserve", field="search.headroom_gib")


def check_search(problem: Problem) -> None:
    """A `search:` restriction that no plan can meet, whatever the other knobs, is bad input
    (exit 2), not an infeasible problem: e.g. `tp: 3` on 8 GPUs."""
    s, m, t = problem.search, problem.model, problem.training
    n = problem.cluster.num_gpus
    div_n = (lambda v: n % v == 0, f"must divide num_gpus ({n})")
    rules: dict[str, list[tuple[Any, str]]] = {
        "tp": [div_n, (lambda v: m.num_attention_heads % v == 0,
                       f"must divide num_attention_heads ({m.num_attention_heads})")],
        "pp": [div_n, (lambda v: v <= m.num_hidden_layers, f"must be at most num_hidden_layers ({m.num_hidden_layers})")],
        "cp": [div_n, (lambda v: v == 1 or t.seq_len % (2 * v) == 0,
                       f"must split seq_len ({t.seq_len}) into 2*cp equal chunks")],
        "dp": [div_n],
        "ep": [(lambda v: v == 1 or m.is_moe, "above 1 needs a mixture-of-experts model (num_experts is 0)"),
               (lambda v: v == 1 or m.num_experts % v == 0, f"must divide num_experts ({m.num_experts})"), div_n],
        "micro_batch_size": [(lambda v: t.global_batch_size % v == 0,
                              f"must divide global_batch_size ({t.global_batch_size})")],
        # DualPipe and DualPipeV hold two stages per rank: the solver's stage model has no such layout
        "schedule": [(lambda v: v not in UNPLANNABLE_SCHEDULES,
                      "is not planned by the solver (two stages per rank; `evaluate` and `compare` price it): "
                      "search 1f1b, interleaved, zero_bubble or gpipe")],
    }
    for knob, checks in rules.items():
        left = s.allowed(knob, [])
        for ok, what in checks:
            keep = [v for v in left if ok(v)]
            if left and not keep:
                who = f"{knob}={left[0]}, but" if len(left) == 1 else \
                    f"none of the allowed values ({', '.join(map(str, left))}) fits:"
                raise InputError(f"{who} {knob} {what}", field=f"search.{knob}")
            left = keep


def load_plan(source: str | os.PathLike[str] | Mapping[str, Any] | Plan) -> Plan:
    """A `Plan` from a path (a plan file, a problem file with `plan:`, or a solution JSON) or a dict."""
    if isinstance(source, Plan):
        return source
    if isinstance(source, Mapping):
        data, src = dict(source), None
    elif isinstance(source, (str, os.PathLike)):
        data, src = read_document(source), str(source)
    else:  # already-parsed data that is not a mapping (a list, a number, None): reported by validate
        data, src = source, None
    root = ""
    if isinstance(data, dict) and isinstance(data.get("plan"), dict):
        data, root = data["plan"], "plan"
    return validate(Plan, data, source=src, root=root)


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


# ---- measured runs (`validate`, `calibrate`): dev_runs.json shape, or a CSV with its columns ----

RUN_INT_COLUMNS = ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "seq_len", "moe_experts",
                   "moe_shared_experts", "moe_top_k", "gpu_count", "gpus_per_node", "tp", "pp", "dp", "cp", "ep",
                   "zero_stage", "vpp_chunks", "layers_per_virtual_stage", "micro_batch", "global_batch_seqs",
                   "global_batch_tokens", "grad_accum")
RUN_FLOAT_COLUMNS = ("params_b", "active_params_b", "peak_tflops_for_mfu", "tflops_per_gpu", "step_time_s",
                     "tokens_per_sec", "tokens_per_sec_per_gpu", "mfu_pct", "hfu_pct", "aggregate_pflops",
                     "measured_peak_memory_gib", "measured_peak_memory_gb")
# Plausible ranges of the measured figures (outside: a typo or a unit mix-up, not a run):
# a step between 0.1 ms and a day, throughput up to 10^12 tokens/s, up to 10^5 TFLOP/s per GPU.
RUN_RANGES = {"step_time_s": (1e-4, 86_400.0), "tokens_per_sec": (1e-3, 1e12), "tflops_per_gpu": (1e-3, 1e5),
              "gpu_count": (1, 2**20), "measured_peak_memory_gib": (1e-3, 1e5), "measured_peak_memory_gb": (1e-3, 1e5)}
RUN_REQUIRED_COLUMNS = ("id", "model", "gpu", "gpu_count", "precision", "layers", "hidden", "vocab", "seq_len",
                        "global_batch_seqs")
RUN_STEP_COLUMNS = ("step_time_s", "tokens_per_sec", "tflops_per_gpu")


def _csv_cell(text: str) -> Any:
    t = text.strip()
    if t == "" or t.lower() in ("null", "none", "nan"):
        return None
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def _check_run_value(key: str, value: Any) -> str | None:
    """What is wrong with one cell of a run, or None."""
    if value is None:
        return None
    if key in RUN_INT_COLUMNS or key in RUN_FLOAT_COLUMNS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"not a number ({_short_repr(value)})"
        if not math.isfinite(value):
            return f"not a finite number ({value})"
        if key in RUN_INT_COLUMNS and value != int(value):
            return f"not a whole number ({value})"
        lo, hi = RUN_RANGES.get(key, (0, math.inf))
        if not lo <= value <= hi:
            return f"{value:g} is outside the plausible range [{lo:g}, {hi:g}]"
    elif key == "id" and not (isinstance(value, (str, int)) and str(value).strip()):
        return f"a run id must be non-empty text (got {_short_repr(value)})"
    return None


def read_runs(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Measured runs from a dev_runs-shaped JSON file (a list, or {runs: [...]}) or a CSV with the
    same column names, every cell checked: one InputError line naming the file, the row and the
    column (a non-numeric or non-finite number, an absurd step time, a duplicate run id, a missing
    column, a semicolon-separated CSV)."""
    p = Path(path)
    src = str(path)
    if not p.is_file():
        raise InputError("runs file not found" if not p.exists() else "not a regular file", source=src)
    raw = read_limited(p, MAX_FILE_BYTES, what="runs file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})", source=src) from None
    if not text.strip():
        raise InputError("empty file", source=src)
    where: list[str] = []  # per row: how to name it in a message
    if p.suffix.lower() == ".csv":
        import csv  # noqa: PLC0415

        lines = text.splitlines()
        header = next((ln for ln in lines if ln.strip()), "")
        if header.count(";") > header.count(",") or header.count("\t") > header.count(","):
            sep = "semicolons" if header.count(";") >= header.count("\t") else "tabs"
            raise InputError(f"the columns are separated by {sep}; autoshard reads comma-separated CSV "
                             "(re-export with ',' as the delimiter)", source=src, field="line 1")
        reader = csv.DictReader(lines)
        columns = [c.strip() for c in (reader.fieldnames or []) if c is not None]
        dup_col = next((c for i, c in enumerate(columns) if c in columns[:i]), None)
        if dup_col:
            raise InputError(f"column {dup_col!r} appears twice in the header", source=src, field="line 1")
        missing = [c for c in RUN_REQUIRED_COLUMNS if c not in columns]
        if not any(c in columns for c in RUN_STEP_COLUMNS):
            missing.append(" or ".join(RUN_STEP_COLUMNS))
        if missing:
            raise InputError(f"missing column(s): {', '.join(missing)} (the header has: {', '.join(columns[:12])}"
                             f"{', ...' if len(columns) > 12 else ''}; columns as in dev_runs.json)",
                             source=src, field="line 1")
        rows = []
        for i, r in enumerate(reader, start=1):
            extra = r.get(None)
            if extra:
                raise InputError(f"{len(extra)} more cell(s) than the header's {len(columns)} columns",
                                 source=src, field=f"row {i} (line {reader.line_num})")
            rows.append({k.strip(): _csv_cell(v or "") for k, v in r.items() if k})
            where.append(f"row {i} (line {reader.line_num}), column ")
    else:
        doc = parse_json(text, src)
        rows = doc.get("runs") if isinstance(doc, dict) else doc
        key = "runs" if isinstance(doc, dict) else ""
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise InputError("expected a list of run objects (or {runs: [...]})", source=src)
        where = [f"{key}[{i}]." for i in range(len(rows))]
    if not rows:
        raise InputError("no runs in the file", source=src)
    seen: dict[str, str] = {}
    for row, at in zip(rows, where):
        for k, v in row.items():
            bad = _check_run_value(str(k), v)
            if bad:
                raise InputError(bad, source=src, field=f"{at}{k}")
        rid = row.get("id")
        if rid is None:
            raise InputError("a run id is required", source=src, field=f"{at}id")
        rid = str(rid).strip()
        if rid in seen:
            raise InputError(f"duplicate run id {rid!r} (first at {seen[rid].removesuffix(', column ').rstrip('.')})",
                             source=src, field=f"{at}id")
        seen[rid] = at
    return rows


def dumps_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, 2-space indent, trailing newline (byte-stable)."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
