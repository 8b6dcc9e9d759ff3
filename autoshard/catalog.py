"""Catalog of GPUs, network topologies and model presets, read from `autoshard/data/*.yaml`.

The data files carry a source for every figure. A calibrated catalog (written by
`autoshard calibrate`) is an overlay file whose `gpus:` entries replace the
`efficiency` factors of the named GPUs; a problem points at it with
`cluster.catalog`.

Efficiency factors, all in (0, 1]:
- `matmul.<precision>`: achieved / peak tensor FLOP/s of a large GEMM;
- `hbm`: achieved / peak HBM bandwidth for streaming kernels;
- `scaleup` / `scaleout`: achieved bus bandwidth / link bandwidth of NCCL collectives on the
  innermost (NVLink) level and on the scale-out levels.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from .errors import InputError, closest
from .spec import ModelSpec, Strict, TopologyLevel


class Efficiency(Strict):
    matmul: dict[str, float]
    hbm: float = Field(gt=0, le=1)
    scaleup: float = Field(gt=0, le=1)
    scaleout: float = Field(gt=0, le=1)


class Price(Strict):
    usd_per_gpu_hour: float = Field(gt=0)
    purchase_usd: float = Field(gt=0)


class GPU(Strict):
    id: str
    name: str
    aliases: list[str] = []
    peak_tflops: dict[str, float]
    hbm_gib: float = Field(gt=0)
    hbm_tb_per_s: float = Field(gt=0)
    scaleup: str
    scaleup_gb_per_s: float = Field(gt=0)
    tdp_w: float = Field(gt=0)
    default_topology: str
    price: Price
    efficiency: Efficiency
    sources: dict[str, str]

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s; fp8 on a GPU without fp8 runs at the bf16 rate."""
        return 1e12 * self.peak_tflops.get(precision, self.peak_tflops["bf16"])

    def matmul_efficiency(self, precision: str) -> float:
        return self.efficiency.matmul.get(precision, self.efficiency.matmul["bf16"])

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gib * 2**30

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_per_s * 1e12


class Topology(Strict):
    id: str
    description: str = ""
    source: str = ""
    levels: list[TopologyLevel]


def _data(name: str) -> Any:
    text = resources.files("autoshard.data").joinpath(name).read_text(encoding="utf-8")
    return yaml.safe_load(text)


@functools.cache
def _gpus() -> dict[str, GPU]:
    return {k: GPU(id=k, **v) for k, v in _data("gpus.yaml").items()}


@functools.cache
def _topologies() -> dict[str, Topology]:
    return {k: Topology(id=k, **v) for k, v in _data("topologies.yaml").items()}


@functools.cache
def _models() -> dict[str, dict[str, Any]]:
    return dict(_data("models.yaml"))


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@functools.cache
def _aliases() -> dict[str, str]:
    table: dict[str, str] = {}
    for gid, gpu in _gpus().items():
        for a in [gid, *gpu.aliases]:
            table[_norm(a)] = gid
    return table


def gpu_ids() -> list[str]:
    return list(_gpus())


def topology_ids() -> list[str]:
    return list(_topologies())


def model_ids() -> list[str]:
    return list(_models())


def get_gpu(name: str, catalog: str | None = None) -> GPU:
    """The catalog entry of a GPU by id or alias (case-insensitive), with calibration applied."""
    gid = _aliases().get(_norm(name))
    if gid is None:
        raise InputError(f"unknown GPU {name!r} ({closest(_norm(name), _aliases())})", field="cluster.gpu")
    gpu = _gpus()[gid]
    if catalog:
        overlay = load_overlay(catalog).get(gid)
        if overlay:
            gpu = gpu.model_copy(update={"efficiency": overlay})
    return gpu


def get_topology(name: str) -> Topology:
    topo = _topologies().get(_norm(name))
    if topo is None:
        raise InputError(f"unknown topology {name!r} ({closest(_norm(name), _topologies())})", field="cluster.topology")
    return topo


def resolve_model(value: Any) -> Any:
    """A preset name, `{preset: name, **overrides}` or `{hf_config: path}` -> explicit fields.

    Anything else is returned unchanged for pydantic to validate.
    """
    if isinstance(value, str):
        value = {"preset": value}
    if not isinstance(value, dict):
        return value
    if "hf_config" in value:
        from .hf import model_from_hf_config  # noqa: PLC0415  (optional path, imported on use)

        not_a_fifo(value["hf_config"])
        rest = {k: v for k, v in value.items() if k != "hf_config"}
        base = model_from_hf_config(value["hf_config"]).model_dump(exclude_none=True)
        return {**base, **rest}
    if "preset" in value:
        name = _norm(str(value["preset"]))
        presets = _models()
        if name not in presets:
            raise InputError(f"unknown model preset {value['preset']!r} ({closest(name, presets)})", field="model")
        return {"name": name, **presets[name], **{k: v for k, v in value.items() if k != "preset"}}
    return value


def not_a_fifo(path: Any) -> None:
    """Refuse a FIFO, socket or device given as a file: reading it could block forever."""
    if isinstance(path, (str, Path)) and path:
        p = Path(path)
        if p.exists() and not p.is_dir() and not p.is_file():
            raise InputError("not a regular file (a FIFO, socket or device)", source=str(path))


def get_model(name: str) -> ModelSpec:
    return ModelSpec(**resolve_model(name))


@functools.cache
def _overlay_cached(path: str, mtime: float) -> dict[str, Efficiency]:
    from .loader import MAX_YAML_BYTES, parse_yaml, read_limited  # noqa: PLC0415

    raw = read_limited(path, MAX_YAML_BYTES, what="calibrated catalog")  # size checked before reading
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read calibrated catalog: not UTF-8 text (byte {exc.start})", source=path) from None
    doc = parse_yaml(text, path) or {}  # duplicate keys rejected at the second key's line
    out: dict[str, Efficiency] = {}
    try:
        for k, v in (doc.get("gpus") or {}).items():
            try:
                out[_aliases().get(_norm(k), k)] = Efficiency(**v["efficiency"])
            except ValidationError as exc:
                # Not str(exc): it would repr the whole input, which a YAML alias bomb makes endless.
                from .loader import format_validation_error  # noqa: PLC0415

                loc, msg = format_validation_error(exc, Efficiency)
                raise InputError(f"malformed calibrated catalog: {msg}", source=path,
                                 field=".".join(x for x in ("gpus", str(k), "efficiency", loc) if x)) from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"malformed calibrated catalog ({exc.__class__.__name__}: {exc})".splitlines()[0], source=path) from None
    return out


def load_overlay(path: str) -> dict[str, Efficiency]:
    p = Path(path)
    if not p.is_file():
        # No source: the error is attributed to the problem file that names the catalog.
        raise InputError(f"calibrated catalog {path!r} not found", field="cluster.catalog")
    return _overlay_cached(str(p.resolve()), p.stat().st_mtime)
