"""pydantic validation errors as one line: `validate` builds a schema model from data and turns a
failure into an `InputError` naming the field path (`format_validation_error`). Apart from the
loader so that the catalog, whose records are schema models too, can use it without importing the
loader (which reads the catalog)."""

from __future__ import annotations

import reprlib
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import InputError, closest

M = TypeVar("M", bound=BaseModel)

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 60, 60


def short_repr(value: Any) -> str:
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
        msg = f"{msg} (got {short_repr(err['input'])})"[:300]
    msg = msg.removeprefix("Value error, ")
    return path, msg


def validate(model: type[M], data: Any, *, source: str | None = None, root: str = "") -> M:
    """Build a pydantic model from data, turning failures into one-line InputErrors."""
    if not isinstance(data, Mapping):
        kind = "empty document" if data is None else f"a {type(data).__name__}"
        raise InputError(f"expected a mapping of fields, got {kind}", source=source, field=root or None)
    odd = next((k for k in data if not isinstance(k, str)), None)
    if odd is not None:
        raise InputError(f"field names must be text, got {short_repr(odd)}", source=source, field=root or None)
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
