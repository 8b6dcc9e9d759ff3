"""Reading problems and plans (YAML, JSON or dicts) and writing files atomically.

Every failure becomes one `InputError` line: `file: field.path: what is wrong`.
YAML is read with the safe loader only: tags such as `!!python/object` are
rejected, never executed.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import InputError
from .spec import Plan, Problem

M = TypeVar("M", bound=BaseModel)

MAX_FILE_BYTES = 16 * 2**20


def read_document(path: str | os.PathLike[str]) -> Any:
    """Parse a YAML or JSON file into Python data, or raise a one-line InputError."""
    p = Path(path)
    src = str(path)
    if not p.exists():
        raise InputError("no such file", source=src)
    if p.is_dir():
        raise InputError("is a directory, expected a problem file", source=src)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", source=src) from None
    if len(raw) > MAX_FILE_BYTES:
        raise InputError(f"file is {len(raw)} bytes, larger than the {MAX_FILE_BYTES} allowed", source=src)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})", source=src) from None
    if not text.strip():
        raise InputError("empty file", source=src)
    if p.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}", source=src) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if "python/" in str(exc) or "could not determine a constructor" in str(exc):
            what = "YAML tags that construct Python objects are not allowed (" + str(what).strip() + ")"
        raise InputError(f"YAML syntax error{where}: {what}", source=src) from None


def format_validation_error(exc: ValidationError) -> tuple[str, str]:
    """(field path, message) of the first error of a pydantic ValidationError."""
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(x) for x in err["loc"] if not str(x).startswith("function-"))
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif "input" in err and err["type"] not in ("value_error", "assertion_error"):
        msg = f"{msg} (got {err['input']!r})"[:300]
    msg = msg.removeprefix("Value error, ")
    return loc, msg


def validate(model: type[M], data: Any, *, source: str | None = None, root: str = "") -> M:
    """Build a pydantic model from data, turning failures into one-line InputErrors."""
    if not isinstance(data, Mapping):
        kind = "empty document" if data is None else f"a {type(data).__name__}"
        raise InputError(f"expected a mapping of fields, got {kind}", source=source, field=root or None)
    try:
        return model(**data)
    except InputError as exc:  # raised while resolving presets / hf_config
        raise exc.at(source) from None
    except ValidationError as exc:
        loc, msg = format_validation_error(exc)
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
    else:
        data, src = read_document(source), str(source)
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k != "plan"}
    problem = validate(Problem, data, source=src)
    from .topology import check_cluster  # noqa: PLC0415

    try:
        check_cluster(problem)
    except InputError as exc:
        raise exc.at(src) from None
    return problem


def load_plan(source: str | os.PathLike[str] | Mapping[str, Any] | Plan) -> Plan:
    """A `Plan` from a path (a plan file, a problem file with `plan:`, or a solution JSON) or a dict."""
    if isinstance(source, Plan):
        return source
    if isinstance(source, Mapping):
        data, src = dict(source), None
    else:
        data, src = read_document(source), str(source)
    root = ""
    if isinstance(data, dict) and isinstance(data.get("plan"), dict):
        data, root = data["plan"], "plan"
    return validate(Plan, data, source=src, root=root)


def atomic_write(path: str | os.PathLike[str], text: str) -> None:
    """Write a file so that readers see the old content or the new, never a part."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
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
