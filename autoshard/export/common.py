"""Serialization and recompute helpers shared by the exporters."""

from __future__ import annotations

import json
from typing import Any

from .context import _Ctx
from ..spec import mode_order


def dumps_json(obj: Any, indent: int = 2) -> str:
    """JSON with objects indented and short lists (of scalars, or of lists of scalars) kept on
    one line: stable, diff-friendly and readable. Parses back with `json.loads`."""

    def flat(v: Any) -> bool:
        if isinstance(v, list):
            return all(not isinstance(x, (dict, list)) or (isinstance(x, list) and flat(x)) for x in v)
        return not isinstance(v, dict)

    def render(v: Any, level: int) -> str:
        pad, inner = " " * (indent * level), " " * (indent * (level + 1))
        if isinstance(v, dict):
            if not v:
                return "{}"
            items = [f"{inner}{json.dumps(str(k))}: {render(x, level + 1)}" for k, x in v.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(v, list):
            if flat(v):
                one = "[" + ", ".join(render(x, level + 1) for x in v) + "]"
                if len(one) + len(inner) <= 100:
                    return one
            if not v:
                return "[]"
            return "[\n" + ",\n".join(inner + render(x, level + 1) for x in v) + "\n" + pad + "]"
        return json.dumps(v)

    return render(obj, 0)


def _recompute_counts(ctx: _Ctx) -> dict[str, int]:
    return {m: ctx.recompute.count(m) for m in mode_order(ctx.recompute) if ctx.recompute.count(m)}


def recompute_runs(modes: list[str]) -> list[list[Any]]:
    """A per-layer recompute list as runs: [["full", 3], ["none", 77]]."""
    runs: list[list[Any]] = []
    for mode in modes:
        if runs and runs[-1][0] == mode:
            runs[-1][1] += 1
        else:
            runs.append([mode, 1])
    return runs


def _most_conservative(modes: list[str]) -> str:
    for m in ("full", "selective", "none"):
        if m in modes:
            return m
    return "none"
