"""`load_study`: a what-if study file read, checked and expanded into workloads x options (the
schema is whatif/schema.py; the default notes come from pricing, which needs the schema)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..catalog import get_gpu, get_topology, gpu_ids, load_overlay, resolve_model
from ..errors import InputError
from ..fileio import read_document
from ..loader import file_folder, named_file_error, resolve_path
from ..schema_errors import validate
from .pricing import default_notes
from .schema import (
    MAX_OPTIONS,
    Option,
    Pool,
    RangeSpec,
    Study,
    StudySpec,
    Workload,
    fmt_tokens,
    power_figures,
)

def _norm_gpu(name: str, field: str, source: str | None) -> str:
    try:
        return get_gpu(name).id
    except InputError as exc:
        raise InputError(exc.message, source=source, field=field) from None


def load_study(source: str | os.PathLike[str] | Mapping[str, Any] | StudySpec) -> Study:
    """A validated, expanded study from a YAML/JSON path, a dict or a StudySpec.

    Raises a one-line `InputError` (`file: field.path: what is wrong`) on bad input.
    """
    spec, src = _read_spec(source)
    workloads = _workloads(spec, src)
    _check_networks(spec, src)
    _check_pricing_gpus(spec, src)
    options = _options(spec, src)
    pools = _pools(spec, src, options)
    opts = tuple(sorted(options.values(), key=Option.sort_key))
    figures = power_figures([Option(g, 1, "", "cloud") for g in gpu_ids()])  # any the catalog has; a GPU
    if spec.pricing.power_figure not in figures:                           # without it uses `catalog`
        raise InputError(f"unknown power figure {spec.pricing.power_figure!r} (valid: {', '.join(figures)})",
                         source=src, field="pricing.power_figure")
    return Study(spec, tuple(workloads), opts, src, tuple(default_notes(spec, opts)), tuple(pools))


def _read_spec(source: str | os.PathLike[str] | Mapping[str, Any] | StudySpec) -> tuple[StudySpec, str | None]:
    """The StudySpec and the file it came from (None for a dict or a StudySpec): presets and
    config.json files resolved, paths in a file taken relative to its folder."""
    src: str | None = None
    if isinstance(source, StudySpec):
        spec = source
    else:
        folder: str | None = None  # paths in a study file are relative to its folder; in a dict, to the working dir
        if isinstance(source, Mapping):
            data: Any = dict(source)
        else:
            src = str(source)
            data = read_document(source)
            folder = file_folder(source)
        if isinstance(data, dict) and isinstance(data.get("workloads"), list):
            wls = []
            for i, w in enumerate(data["workloads"]):
                if isinstance(w, dict) and "model" in w:
                    model = w["model"]
                    if isinstance(model, dict) and "hf_config" in model:
                        model = {**model, "hf_config": resolve_path(model["hf_config"], folder)}
                    try:
                        w = {**w, "model": resolve_model(model)}
                    except InputError as exc:
                        if exc.source:  # in the config.json the workload names
                            raise named_file_error(exc, src, f"workloads.{i}.model.hf_config") from None
                        raise InputError(exc.message, source=src, field=f"workloads.{i}.model") from None
                wls.append(w)
            data = {**data, "workloads": wls}
        if folder is not None and isinstance(data, dict) and isinstance(data.get("options"), list):
            data = {**data, "options": [{**o, "catalog": resolve_path(o["catalog"], folder)}
                                        if isinstance(o, dict) and "catalog" in o else o for o in data["options"]]}
        if folder is not None and isinstance(data, dict) and isinstance(data.get("fleet"), list):
            data = {**data, "fleet": [{**o, "catalog": resolve_path(o["catalog"], folder)}
                                      if isinstance(o, dict) and "catalog" in o else o for o in data["fleet"]]}
        spec = validate(StudySpec, data, source=src)
    return spec, src


def _workloads(spec: StudySpec, src: str | None) -> list[Workload]:
    """One workload per token budget, each named distinctly."""
    workloads: list[Workload] = []
    for i, w in enumerate(spec.workloads):
        budgets = w.tokens if isinstance(w.tokens, list) else [w.tokens]
        if not budgets:
            raise InputError("an empty list allows nothing", source=src, field=f"workloads.{i}.tokens")
        base = w.name or w.model.name
        for t in budgets:
            name = base if len(budgets) == 1 else f"{base} @ {fmt_tokens(t)} tokens"
            workloads.append(Workload(len(workloads), name, w.model, w.training, w.search, float(t), base))
    names = [w.name for w in workloads]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise InputError(f"two workloads are named {dup!r}; give each a distinct name", source=src, field="workloads")
    return workloads


def _check_networks(spec: StudySpec, src: str | None) -> None:
    """The study's networks: level sizes grow and each divides the next."""
    for name, net in spec.networks.items():
        lv = net.levels
        for i in range(1, len(lv)):
            if lv[i].size <= lv[i - 1].size or lv[i].size % lv[i - 1].size:
                raise InputError(f"level sizes must grow and each divide the next ({lv[i - 1].size} -> {lv[i].size})",
                                 source=src, field=f"networks.{name}.levels.{i}.size")


def _check_pricing_gpus(spec: StudySpec, src: str | None) -> None:
    """Pricing and reliability tables keyed by GPU name only known GPUs."""
    for key in ("usd_per_gpu_hour", "purchase_usd_per_gpu"):
        for g in getattr(spec.pricing, key):
            _norm_gpu(g, f"pricing.{key}.{g}", src)
    if isinstance(spec.pricing.spot_discount, dict):
        for g in spec.pricing.spot_discount:
            _norm_gpu(g, f"pricing.spot_discount.{g}", src)
    if isinstance(spec.pricing.node_overhead_w, dict):
        for g in spec.pricing.node_overhead_w:
            _norm_gpu(g, f"pricing.node_overhead_w.{g}", src)
    if isinstance(spec.reliability.failures_per_gpu_hour, dict):
        for g in spec.reliability.failures_per_gpu_hour:
            _norm_gpu(g, f"reliability.failures_per_gpu_hour.{g}", src)


def _options(spec: StudySpec, src: str | None) -> dict[str, Option]:
    """The hardware options: the cartesian product of every option entry (GPU x count x topology x
    pricing mode), by id."""
    default_modes = spec.pricing.mode if isinstance(spec.pricing.mode, list) else [spec.pricing.mode]
    options: dict[str, Option] = {}
    for i, o in enumerate(spec.options):
        gpus = o.gpu if isinstance(o.gpu, list) else [o.gpu]
        counts = o.num_gpus.values() if isinstance(o.num_gpus, RangeSpec) else (
            o.num_gpus if isinstance(o.num_gpus, list) else [o.num_gpus])
        modes = default_modes if o.mode is None else (o.mode if isinstance(o.mode, list) else [o.mode])
        if not gpus or not counts or not modes:
            raise InputError("an empty list allows nothing", source=src, field=f"options.{i}")
        if o.catalog:  # a missing or malformed calibrated catalog is bad input, reported before any solve
            try:
                load_overlay(o.catalog)
            except InputError as exc:
                if exc.source:
                    raise named_file_error(exc, src, f"options.{i}.catalog") from None
                raise InputError(exc.message, source=src, field=f"options.{i}.catalog") from None
        for g in gpus:
            gid = _norm_gpu(g, f"options.{i}.gpu", src)
            topos = [get_gpu(gid).default_topology] if o.topology is None else (
                o.topology if isinstance(o.topology, list) else [o.topology])
            for t in topos:
                if t not in spec.networks:
                    try:
                        t = get_topology(t).id
                    except InputError as exc:
                        raise InputError(exc.message + (f"; or a study network ({', '.join(spec.networks)})"
                                                         if spec.networks else ""),
                                         source=src, field=f"options.{i}.topology") from None
                for n in counts:
                    for m in modes:
                        opt = Option(gid, int(n), t, m, o.catalog)
                        options.setdefault(opt.id, opt)
                if len(options) > MAX_OPTIONS:
                    raise InputError(f"the study expands to more than {MAX_OPTIONS:,} hardware options (GPU x count x "
                                     "topology x pricing mode): split it, or sweep with a larger step or factor",
                                     source=src, field=f"options.{i}")
    return options


def _pools(spec: StudySpec, src: str | None, options: dict[str, Option]) -> list[Pool]:
    """The fleet's pools; each is an owned option, added to `options`."""
    pools: list[Pool] = []
    for i, ps in enumerate(spec.fleet):  # each pool is an owned option; the fleet answer reads its rows
        gid = _norm_gpu(ps.gpu, f"fleet.{i}.gpu", src)
        t = ps.topology or get_gpu(gid).default_topology
        if t not in spec.networks:
            try:
                t = get_topology(t).id
            except InputError as exc:
                raise InputError(exc.message, source=src, field=f"fleet.{i}.topology") from None
        if ps.catalog:
            try:
                load_overlay(ps.catalog)
            except InputError as exc:
                raise InputError(exc.message, source=src, field=f"fleet.{i}.catalog") from None
        opt = Option(gid, ps.num_gpus, t, "own", ps.catalog)
        options.setdefault(opt.id, opt)
        pools.append(Pool(ps.name, opt, ps.owned))
    return pools
