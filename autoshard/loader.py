"""Reading problems and plans (YAML, JSON or dicts) and measured runs.

The bounded reader, the strict YAML/JSON parsers, the output-path guard and the atomic writer
live in `autoshard.fileio` (the ground floor); the names are re-exported here for old callers.

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

import csv
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .catalog import _aliases, _gpus, _norm, default_precision, get_gpu, load_overlay, resolve_model
from .errors import InputError
from .fileio import MAX_FILE_BYTES, parse_json, read_document, read_text
from .frameworks import profiles
from .schema_errors import short_repr, validate
from .spec import UNPLANNABLE_SCHEDULES, Plan, Problem
from .topology import check_cluster


# Tokens per training step (global_batch_size sequences x seq_len) above which a batch is taken for a
# unit mistake (tokens given as sequences): 1e9 is 60x the largest published batch (Llama 3 405B: 16M
# tokens), and far past it the solver's integer model would overflow.
MAX_TOKENS_PER_STEP = 1e9


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
        if "model" in data:
            try:  # an error in the config.json names both files
                data["model"] = resolve_model(data["model"])
            except InputError as exc:
                raise named_file_error(exc, src, "model.hf_config") from None
        data = with_default_precision(data)
    problem = validate(Problem, data, source=src)

    try:
        check_cluster(problem)
        check_batch(problem)
        check_catalog(problem)
        check_search(problem)
        _check_headroom(problem)
    except InputError as exc:  # one with a file of its own is in the calibrated catalog the problem names
        raise named_file_error(exc, src, "cluster.catalog") from None
    return problem


def with_default_precision(data: dict[str, Any]) -> dict[str, Any]:
    """A problem document that names no precision trains in bf16, or in fp16 on a GPU without bf16
    (V100): the GPU's default precision (`catalog.default_precision`) is written into `training`.
    An unknown GPU is left for validation to report."""
    training, cluster = data.get("training"), data.get("cluster")
    if isinstance(training, dict) and "precision" not in training and isinstance(cluster, dict) \
            and isinstance(cluster.get("gpu"), str):
        gid = _aliases().get(_norm(cluster["gpu"]))
        if gid is not None and default_precision(_gpus()[gid]) != "bf16":
            data = {**data, "training": {**training, "precision": default_precision(_gpus()[gid])}}
    return data


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
    }
    _check_search_schedule(problem)  # before the degrees: a schedule no plan can use names search.schedule
    for knob, checks in rules.items():
        left = s.allowed(knob, [])
        for ok, what in checks:
            keep = [v for v in left if ok(v)]
            if left and not keep:
                who = f"{knob}={left[0]}, but" if len(left) == 1 else \
                    f"none of the allowed values ({', '.join(map(str, left))}) fits:"
                raise InputError(f"{who} {knob} {what}", field=f"search.{knob}")
            left = keep


def _check_search_schedule(problem: Problem) -> None:
    """`search.schedule` must leave a schedule that the problem's framework runs (its profile's
    `schedules` in data/frameworks.yaml) and that the solver plans: else no plan exists whatever the
    degrees, which is bad input naming `search.schedule`, not an infeasible problem."""
    asked = problem.search.allowed("schedule", [])
    if not asked:
        return
    fw = profiles()[problem.framework]
    runs = [x for x in asked if x in fw.schedules]
    if not runs:
        listed = ", ".join(repr(x) for x in asked)
        raise InputError(f"{problem.framework} has no {listed} pipeline schedule (it runs {', '.join(fw.schedules)}; "
                         "data/frameworks.yaml)", field="search.schedule")
    if all(x in UNPLANNABLE_SCHEDULES for x in runs):  # two stages per rank: no layout of the solver's stage model
        # DualPipe, where the framework plans it, is re-planned from the CP-SAT search's configurations
        # (solver/dualpipe_plans.py): beside another schedule, never alone
        beside = [x for x in runs if x == "dualpipe" and x not in fw.unplanned_schedules]
        why = ("two stages per rank; priced when a plan names it, not searched" if not beside else
               f"two stages per rank: {', '.join(repr(x) for x in beside)} is planned beside a schedule the CP-SAT "
               "stage model plans, by re-planning its configurations, not alone")
        raise InputError(f"the solver does not plan {', '.join(repr(x) for x in runs)} ({why}): price such a plan "
                         "with `autoshard evaluate --plan` (or `compare`), or allow another schedule (1f1b, "
                         "interleaved, zero_bubble or gpipe)", field="search.schedule")


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
            return f"not a number ({short_repr(value)})"
        if not math.isfinite(value):
            return f"not a finite number ({value})"
        if key in RUN_INT_COLUMNS and value != int(value):
            return f"not a whole number ({value})"
        lo, hi = RUN_RANGES.get(key, (0, math.inf))
        if not lo <= value <= hi:
            return f"{value:g} is outside the plausible range [{lo:g}, {hi:g}]"
    elif key == "id" and not (isinstance(value, (str, int)) and str(value).strip()):
        return f"a run id must be non-empty text (got {short_repr(value)})"
    return None


def read_runs(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Measured runs from a dev_runs-shaped JSON file (a list, or {runs: [...]}) or a CSV with the
    same column names, every cell checked: one InputError line naming the file, the row and the
    column (a non-numeric or non-finite number, an absurd step time, a duplicate run id, a missing
    column, a semicolon-separated CSV)."""
    p = Path(path)
    src = str(path)
    if not p.exists() and not p.is_symlink():
        raise InputError("runs file not found", source=src)
    text = read_text(p, MAX_FILE_BYTES, what="runs file")  # regular files only, size checked before reading
    where: list[str] = []  # per row: how to name it in a message
    if p.suffix.lower() == ".csv":
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
        rows: Any = []
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
