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
import os
import reprlib
import sys
import tempfile
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import InputError, closest
from .spec import Plan, Problem

M = TypeVar("M", bound=BaseModel)

MAX_FILE_BYTES = 16 * 2**20


def read_document(path: str | os.PathLike[str]) -> Any:
    """Parse a YAML or JSON file into Python data, or raise a one-line InputError."""
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
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", source=src) from None
    if len(raw) > MAX_FILE_BYTES:
        raise InputError(f"file is {len(raw)} bytes, larger than the {MAX_FILE_BYTES} allowed", source=src)
    try:
        text = raw.decode("utf-8-sig")  # a leading byte-order mark (Windows editors) is not an error
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})", source=src) from None
    if not text.strip():
        raise InputError("empty file", source=src)
    if p.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}", source=src) from None
        except RecursionError:
            raise InputError(f"nested too deeply (more than about {sys.getrecursionlimit()} levels)", source=src) from None
    try:
        return yaml.safe_load(text)
    except yaml.reader.ReaderError as exc:  # a control character such as NUL
        line = text.count("\n", 0, exc.position) + 1
        what = str(exc).splitlines()[0].strip()
        raise InputError(f"YAML syntax error at line {line}: {what}", source=src) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if "python/" in str(exc) or "could not determine a constructor" in str(exc):
            what = "YAML tags that construct Python objects are not allowed (" + str(what).strip() + ")"
        raise InputError(f"YAML syntax error{where}: {what}", source=src) from None
    except RecursionError:
        raise InputError(f"nested too deeply (more than about {sys.getrecursionlimit()} levels)", source=src) from None


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
        check_search(problem)
    except InputError as exc:  # one with a file of its own is in the calibrated catalog the problem names
        raise named_file_error(exc, src, "cluster.catalog") from None
    return problem


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
    """Write a file (text as UTF-8, or bytes) so that readers see the old content or the new,
    never a part. Permissions follow the umask like any new file (mkstemp alone makes 0600)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def dumps_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, 2-space indent, trailing newline (byte-stable)."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
