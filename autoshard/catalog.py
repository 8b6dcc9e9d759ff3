"""Catalog of GPUs, network topologies, training precisions and model presets, read from
`autoshard/data/*.yaml`.

The data files carry a source for every figure. A calibrated catalog (written by
`autoshard calibrate`) is an overlay file whose `gpus:` entries replace the
`efficiency` factors of the named GPUs; a problem points at it with
`cluster.catalog`.

Memory: `hbm_gb` is the vendor's figure (1e9 B), `hbm_usable_gib` what the driver exposes (2**30 B);
`GPU.hbm_bytes` is the usable figure. Precisions (`precisions.yaml`) are recipes as run; the cost
model asks `gemm_flops_per_s`, `gemm_peak_flops_per_s`, `weight_copy_bytes_per_param` (and may ask
`quant_overhead_bytes_per_element`, `low_precision_fraction`, `attention_flops_per_s`);
`check_precision` rejects a recipe the GPU has no tensor cores for.

Efficiency factors, all in (0, 1]:
- `matmul.<dtype>`: achieved / peak tensor FLOP/s of a large GEMM in training (bf16, fp8; fp16 falls back
  to bf16, fp4 to fp8). Not written in gpus.yaml: derived at load (`derived_matmul`) as the GPU's sourced
  achievable large-GEMM fraction (`gemm_achievable`, published MAMF) x its sustained-clock fraction under
  its power limit (`clock_fraction`: tdp_w vs rated_power_w, or a cluster's `power_cap_w`) x the fitted
  end-to-end factor of its generation and precision family (autoshard/data/matmul.yaml); a calibrated
  overlay replaces it;
- `hbm`: achieved / peak HBM bandwidth for streaming kernels;
- `scaleup` / `scaleout`: achieved bus bandwidth / link bandwidth of NCCL collectives on the
  innermost (NVLink) level and on the scale-out levels.
"""

from __future__ import annotations

import functools
import math
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import Field, ValidationError

from .errors import InputError, closest
from .fileio import MAX_YAML_BYTES, check_input_file, parse_yaml, read_text
from .spec import EfficiencyFactor, ModelSpec, Strict, TopologyLevel
from .hf import model_from_hf_config
from .schema_errors import format_validation_error


GemmDtype = Literal["bf16", "fp16", "fp8", "fp4"]  # GEMM_DTYPES


class Efficiency(Strict):
    """A GPU's efficiency factors, in gpus.yaml and in a calibrated catalog overlay alike: each one
    under the range policy `spec.EfficiencyFactor` (finite, in [1e-3, 1]); `matmul` names at least
    one GEMM data type of GEMM_DTYPES (an unknown key is bad input, not ignored)."""

    matmul: Annotated[dict[GemmDtype, EfficiencyFactor], Field(min_length=1)]
    hbm: EfficiencyFactor
    scaleup: EfficiencyFactor
    scaleout: EfficiencyFactor


class Price(Strict):
    usd_per_gpu_hour: float = Field(gt=0)
    purchase_usd: float = Field(gt=0)


GEMM_DTYPES: tuple[str, ...] = get_args(GemmDtype)
# The data type whose figure stands in for a missing one: the other 16-bit type, fp4 -> fp8.
_DTYPE_FALLBACK = {"bf16": "fp16", "fp16": "bf16", "fp8": "bf16", "fp4": "fp8"}


# PCIe x16 bandwidth per direction by the generation each architecture's SXM/OAM parts use to reach the
# host (NVIDIA/AMD datasheets: V100 Gen3, A100/Ada Gen4, H100/H200/B200/B300/MI300X/MI355X Gen5).
PCIE_X16_GB_PER_S = {"volta": 15.8, "ampere": 31.5, "ada": 31.5, "hopper": 63.0, "blackwell": 63.0,
                     "blackwell-ultra": 63.0, "cdna3": 63.0, "cdna4": 63.0}


class GPU(Strict):
    id: str
    name: str
    arch: str
    aliases: list[str] = []
    peak_tflops: dict[str, float]  # dense, per GEMM data type (GEMM_DTYPES)
    hbm_gb: float = Field(gt=0)  # the vendor's figure ("80 GB")
    hbm_usable_gib: float = Field(gt=0)  # what the driver exposes, GiB (2**30 B)
    precisions: list[str]  # training precisions / recipes this GPU runs (precisions.yaml)
    hbm_tb_per_s: float = Field(gt=0)
    host_memory_gb: float | None = Field(default=None, gt=0)  # CPU memory over NVLink-C2C, per GPU share
    host_link_gb_per_s: float | None = Field(default=None, gt=0)  # NVLink-C2C, each way, per GPU share
    scaleup: str
    scaleup_gb_per_s: float = Field(gt=0)
    tdp_w: float = Field(gt=0)  # the board power limit the part runs at as sold / configured by default
    # The board power the peak figures and the achievable-GEMM fractions (`efficiency.matmul`) are
    # measured at, where the part runs below it (tdp_w < rated_power_w: a power-capped SKU); None: tdp_w.
    rated_power_w: float | None = Field(default=None, gt=0)
    # All-in IT power per GPU (its share of CPUs, switches, NICs, fans) by the source that gives it, where
    # sources differ from tdp_w + the what-if node overhead; a study picks one with `pricing.power_figure`.
    system_power_w: dict[str, float] = {}
    default_topology: str
    price: Price
    efficiency: Efficiency
    # The sourced achievable large-GEMM fraction of peak per data type (published MAMF measurements at
    # rated_power_w; gpus.yaml states each source), the physics input of `sourced_matmul_efficiency`.
    gemm_achievable: dict[str, float] = {}
    # GEMM shape facts (cost.gemm_shape_efficiency): streaming multiprocessors (CUs on AMD) and the
    # output tile one scheduling slot computes, with the SMs a slot spans (2 for Blackwell's
    # CTA-pair tcgen05 MMA).
    sm_count: int = Field(default=132, ge=1)
    gemm_tile: tuple[int, int] = (128, 256)
    gemm_tile_sms: int = Field(default=1, ge=1)
    # Exponentials per second of the special-function units (MUFU.EX2), in T/s: one per attention score,
    # what bounds attention's softmax at small head dims (cost.attention_head_dim_factor). None: unknown.
    exp_tera_per_s: float | None = Field(default=None, gt=0)
    # MUFU.EX2 exponentials per clock per SM (16 on Hopper and Blackwell, 32 on Blackwell Ultra), where the
    # GPU's generation references its fitted factors to another per-SM rate (matmul.yaml
    # `attention_exp_reference_per_sm_clock`; cost.attention_head_dim_factor). None: not stated.
    exp_per_sm_clock: int | None = Field(default=None, ge=1)
    sources: dict[str, str]

    @staticmethod
    def _dtype(table: dict[Any, float], dtype: str) -> float:  # keyed by GEMM dtype names
        seen = set()
        while dtype not in table and dtype not in seen:
            seen.add(dtype)
            dtype = _DTYPE_FALLBACK.get(dtype, "bf16")
        return table[dtype] if dtype in table else table.get("bf16", table.get("fp16", 0.0))

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s of a GEMM data type or recipe (`fp8-current` -> fp8). A type the GPU
        lacks falls back to the next wider it has (fp4 -> fp8 -> bf16 <-> fp16); problem files never
        get there: `check_precision` rejects a recipe the GPU does not run."""
        return 1e12 * self._dtype(self.peak_tflops, gemm_dtype_of(precision))

    def clock_fraction(self, power_cap_w: float | None = None) -> float:
        """Sustained tensor clock under a power limit, as a fraction of the clock at `rated_power_w`:
        (limit / rated) ** clock_power_exponent (matmul.yaml: dynamic power ~ f V^2 with V ~ f), at most 1.
        The limit is tdp_w, or `power_cap_w` (a cluster fact) where lower."""
        limit = min(self.tdp_w, power_cap_w) if power_cap_w else self.tdp_w
        return clock_fraction(limit, self.rated_power_w or self.tdp_w)

    def matmul_efficiency(self, precision: str) -> float:
        """Achieved / peak tensor FLOP/s of a large GEMM in training (efficiency.matmul: for a catalog GPU
        derived at load, gemm_achievable x clock fraction x its generation's end-to-end factor, matmul.yaml;
        a calibrated overlay replaces it)."""
        return self._dtype(self.efficiency.matmul, gemm_dtype_of(precision))

    def sourced_gemm_rate(self, dtype: str) -> float:
        """The GPU's sourced large-GEMM fraction of peak under its power limit (gemm_achievable x
        clock_fraction), before the fitted end-to-end factor; 0 where it states none for the type."""
        return self.gemm_achievable.get(dtype, 0.0) * self.clock_fraction()

    @property
    def hbm_gib(self) -> float:
        """Usable HBM in GiB (the same as `hbm_usable_gib`; kept for callers of the old name)."""
        return self.hbm_usable_gib

    @property
    def hbm_bytes(self) -> float:
        """Usable HBM in bytes: what the driver exposes (`hbm_usable_gib` GiB)."""
        return self.hbm_usable_gib * 2**30

    @property
    def hbm_vendor_bytes(self) -> float:
        """The vendor's capacity figure in bytes (`hbm_gb` x 1e9)."""
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_per_s * 1e12

    @property
    def host_link_bytes_per_s(self) -> float:
        """GPU <-> host memory bandwidth each way: NVLink-C2C where the catalog gives it, else the
        GPU's PCIe generation at x16 (PCI-SIG: Gen3 15.8, Gen4 31.5, Gen5 63 GB/s per direction)."""
        if self.host_link_gb_per_s:
            return self.host_link_gb_per_s * 1e9
        return PCIE_X16_GB_PER_S.get(self.arch, 31.5) * 1e9

    @property
    def host_memory_bytes_per_s(self) -> float:
        """Host DRAM bandwidth per GPU share, for CPU optimizer steps: Grace (LPDDR5X, 500 GB/s per
        Grace: NVIDIA Grace datasheet) over its GPUs where the GPU has C2C, else a DGX-class 2-socket
        server's ~614 GB/s (2 x 8 DDR5-4800 channels x 38.4 GB/s) over 8 GPUs = 77 GB/s."""
        if self.host_link_gb_per_s:
            return 500e9 * self.host_link_gb_per_s / 450.0
        return 77e9


class Topology(Strict):
    id: str
    description: str = ""
    source: str = ""
    aliases: list[str] = []
    levels: list[TopologyLevel]


def _data(name: str) -> Any:
    text = resources.files("autoshard.data").joinpath(name).read_text(encoding="utf-8")
    # (libyaml's parser where PyYAML has it: the same safe constructor, a fifth of the time; the
    # bundled frameworks and catalogs took 0.2 s of every solve with the pure-Python one)
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader


MATMUL_FAMILY = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp4": "fp4"}  # matmul.yaml end_to_end keys


@functools.cache
def _matmul_model() -> dict[str, Any]:
    """matmul.yaml: generations, end-to-end factors per precision family and generation, clock exponent."""
    return _data("matmul.yaml")


def clock_fraction(limit_w: float, rated_w: float) -> float:
    """Sustained clock at a power limit over the clock at the rated power (matmul.yaml), at most 1."""
    return min(1.0, limit_w / rated_w) ** float(_matmul_model()["clock_power_exponent"])


def matmul_generation(arch: str) -> str | None:
    """The generation (matmul.yaml `generations`) of a GPU architecture; None for one not listed."""
    for gen, archs in _matmul_model()["generations"].items():
        if arch in archs:
            return str(gen)
    return None


def attention_exp_reference_per_sm_clock(arch: str) -> int | None:
    """The per-SM exponential rate (MUFU.EX2 per clock per SM) the end-to-end factors of an architecture's
    generation are referenced to (matmul.yaml `attention_exp_reference_per_sm_clock`), or None: the GPU's
    own (its attention is priced relative to its own exponential rate at head dim 128)."""
    table = _matmul_model().get("attention_exp_reference_per_sm_clock") or {}
    gen = matmul_generation(arch)
    return int(table[gen]) if gen in table else None


def end_to_end_factor(family: str, generation: str | None) -> float:
    """The fitted end-to-end matmul factor of a precision family on a generation: its own, else the family's
    `all`, else (a generation nobody measured) the geometric mean of the family's factors."""
    table = {str(k): float(v) for k, v in _matmul_model()["end_to_end"][family].items()}
    if generation in table:
        return table[str(generation)]
    if "all" in table:
        return table["all"]
    return math.exp(sum(math.log(v) for v in table.values()) / len(table))


def derived_matmul(arch: str, gemm_achievable: dict[str, float], clock: float) -> dict[str, float]:
    """efficiency.matmul of a catalog GPU: sourced achievable fraction x clock x end-to-end factor."""
    gen = matmul_generation(arch)
    return {d: round(float(a) * clock * end_to_end_factor(MATMUL_FAMILY[d], gen), 6)
            for d, a in gemm_achievable.items()}


def _gpu_entry(k: str, v: dict[str, Any]) -> GPU:
    v = dict(v)
    eff = dict(v.get("efficiency") or {})
    if "matmul" not in eff:
        clock = clock_fraction(float(v["tdp_w"]), float(v.get("rated_power_w") or v["tdp_w"]))
        eff["matmul"] = derived_matmul(str(v["arch"]), dict(v.get("gemm_achievable") or {}), clock)
    v["efficiency"] = eff
    return GPU(id=k, **v)


@functools.cache
def _gpus() -> dict[str, GPU]:
    return {k: _gpu_entry(k, v) for k, v in _data("gpus.yaml").items()}


@functools.cache
def _topologies() -> dict[str, Topology]:
    return {k: Topology(id=k, **v) for k, v in _data("topologies.yaml").items()}


@functools.cache
def _topology_aliases() -> dict[str, str]:
    table: dict[str, str] = {}
    for tid, topo in _topologies().items():
        for a in [tid, *topo.aliases]:
            table[_norm(a)] = tid
    return table


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


# Words people put before a GPU's name ("NVIDIA H100 SXM5", "AMD Instinct MI300X") and after it
# ("H100 80GB HBM3 GPU"): dropped before the alias table is asked a second time.
GPU_NAME_PREFIXES = ("nvidia-", "amd-", "instinct-", "tesla-")
GPU_NAME_SUFFIXES = ("-gpu", "-gpus")


def resolve_gpu_id(name: str) -> str | None:
    """The catalog id a GPU spelling means, through the alias table (gpus.yaml `aliases`), or None:
    case, spaces and underscores do not matter, and a vendor prefix (GPU_NAME_PREFIXES) or a trailing
    'GPU' is dropped when the spelling as written is not in the table."""
    key = _norm(name)
    table = _aliases()
    if key in table:
        return table[key]
    stripped = key
    changed = True
    while changed:
        changed = False
        for pre in GPU_NAME_PREFIXES:
            if stripped.startswith(pre):
                stripped, changed = stripped[len(pre):], True
        for suf in GPU_NAME_SUFFIXES:
            if stripped.endswith(suf):
                stripped, changed = stripped[: -len(suf)], True
    return table.get(stripped)


def unknown_gpu_message(name: str) -> str:
    """`unknown GPU 'X' (closest: a, b, c)`: the one line for a spelling the alias table lacks."""
    return f"unknown GPU {name!r} ({closest(_norm(name), _aliases())})"


def get_gpu(name: str, catalog: str | None = None, power_cap_w: float | None = None) -> GPU:
    """The catalog entry of a GPU by id or alias (case-insensitive, `resolve_gpu_id`), with calibration
    applied, and a cluster's power cap (`cluster.power_cap_w`) where it is below the GPU's own limit: its
    matmul efficiencies scaled by the sustained-clock ratio (`GPU.clock_fraction`), tdp_w set to the cap."""
    gid = resolve_gpu_id(name)
    if gid is None:
        raise InputError(unknown_gpu_message(name), field="cluster.gpu")
    gpu = _gpus()[gid]
    if catalog:
        overlay = load_overlay(catalog).get(gid)
        if overlay:
            gpu = gpu.model_copy(update={"efficiency": overlay})
    if power_cap_w and power_cap_w < gpu.tdp_w:
        slow = gpu.clock_fraction(power_cap_w) / gpu.clock_fraction()
        eff = gpu.efficiency.model_copy(update={"matmul": {d: v * slow for d, v in gpu.efficiency.matmul.items()}})
        gpu = gpu.model_copy(update={"efficiency": eff, "tdp_w": float(power_cap_w),
                                     "rated_power_w": gpu.rated_power_w or gpu.tdp_w})
    return gpu


def get_topology(name: str) -> Topology:
    """A topology preset by id or alias (case-insensitive)."""
    tid = _topology_aliases().get(_norm(name))
    if tid is None:
        raise InputError(f"unknown topology {name!r} ({closest(_norm(name), _topology_aliases())})",
                         field="cluster.topology")
    return _topologies()[tid]


# ---- training precisions (autoshard/data/precisions.yaml) ---------------------------------


class Recipe(Strict):
    """A training precision as run: the linear GEMMs' data type and the recipe's memory and HBM costs."""

    id: str
    name: str
    aliases: list[str] = []
    gemm_dtype: str
    gemms: list[str]
    bf16_layer_fraction: float = Field(ge=0, lt=1)
    gemm_efficiency_factor: EfficiencyFactor
    weight_copy_bytes_per_param: dict[str, float]
    quant_hbm_bytes_per_element: dict[str, float]
    saved_input_bytes_per_element: dict[str, float] = Field(default_factory=lambda: {"default": 2.0})
    published_speedup_vs_bf16: tuple[float, float] | None = None
    sources: dict[str, str]

    def per_arch(self, table: dict[str, float], gpu: GPU | None) -> float:
        return table.get(gpu.arch, table["default"]) if gpu is not None else table["default"]


@functools.cache
def _recipes() -> tuple[dict[str, Recipe], dict[str, str]]:
    """(recipes by id, name or alias -> id). `alias_of` entries are names of another recipe."""
    raw = _data("precisions.yaml")
    recipes = {k: Recipe(id=k, **v) for k, v in raw.items() if "alias_of" not in v}
    names: dict[str, str] = {}
    for rid, r in recipes.items():
        for a in [rid, *r.aliases]:
            names[_norm(a)] = rid
    for k, v in raw.items():
        if "alias_of" in v:
            names[_norm(k)] = v["alias_of"]
    return recipes, names


def precision_ids() -> list[str]:
    """The names `training.precision` accepts (spec.Precision), recipes and `fp8` (the default FP8 recipe)."""
    return [*_recipes()[0], *_shorthands()]


@functools.cache
def _shorthands() -> tuple[str, ...]:
    """Names in precisions.yaml that stand for another recipe (`fp8: {alias_of: fp8-delayed}`)."""
    return tuple(k for k, v in _data("precisions.yaml").items() if "alias_of" in v)


def precision_id(name: str) -> str | None:
    """The recipe id of a precision name or alias (`FP8-CS` -> `fp8-current`, `fp8` -> `fp8-delayed`,
    `FP8-MX` -> `mxfp8`), or None."""
    return _recipes()[1].get(_norm(str(name)))


def get_recipe(name: str) -> Recipe:
    rid = precision_id(name)
    if rid is None:
        recipes, names = _recipes()
        raise InputError(f"unknown precision {name!r} ({closest(_norm(str(name)), names)})", field="training.precision")
    return _recipes()[0][rid]


def gemm_dtype_of(precision: str) -> str:
    if precision in GEMM_DTYPES:
        return precision
    rid = precision_id(precision)
    return _recipes()[0][rid].gemm_dtype if rid else "bf16"


def supports(gpu: GPU, precision: str) -> bool:
    """Whether the GPU runs this precision (its `precisions:` list in gpus.yaml, aliases resolved)."""
    rid = precision_id(precision)
    return rid is not None and any(precision_id(p) == rid for p in gpu.precisions)


def check_precision(gpu: GPU, precision: str) -> None:
    """Reject, as bad input, a precision the GPU has no tensor cores for (fp8 on A100, bf16 on V100)."""
    get_recipe(precision)  # an unknown name: one line naming the closest
    if not supports(gpu, precision):
        runs = ", ".join(p for p in gpu.precisions if p != "fp8")
        raise InputError(f"{gpu.name} cannot train in {precision} (it runs {runs})", field="training.precision")


def default_precision(gpu: GPU) -> str:
    """The precision a problem gets when it names none: bf16, or fp16 on GPUs without bf16 (V100)."""
    return "bf16" if supports(gpu, "bf16") else "fp16"


def gemm_peak_flops_per_s(gpu: GPU, precision: str) -> float:
    """Dense peak FLOP/s of the recipe's GEMM data type on this GPU (MFU's denominator)."""
    return gpu.peak_flops(get_recipe(precision).gemm_dtype)


def gemm_flops_per_s(gpu: GPU, precision: str) -> float:
    """Achievable FLOP/s of the linear-layer GEMMs under a recipe: peak of its data type x the GPU's
    matmul efficiency for that type x the recipe's kernel factor; where the recipe keeps a share of
    the layers in bf16 (nvfp4), the FLOP-weighted harmonic mean of the two rates."""
    r = get_recipe(precision)
    low = gpu.peak_flops(r.gemm_dtype) * gpu.matmul_efficiency(r.gemm_dtype) * r.gemm_efficiency_factor
    if r.bf16_layer_fraction <= 0:
        return low
    hi = gpu.peak_flops("bf16") * gpu.matmul_efficiency("bf16")
    return 1.0 / (r.bf16_layer_fraction / hi + (1 - r.bf16_layer_fraction) / low)


def attention_flops_per_s(gpu: GPU) -> float:
    """Achievable FLOP/s of core attention, which stays 16-bit in every recipe."""
    return gpu.peak_flops("bf16") * gpu.matmul_efficiency("bf16")


def quant_overhead_bytes_per_element(precision: str, gpu: GPU | None = None) -> float:
    """HBM bytes moved to quantize one element of a low-precision GEMM input (0 for bf16/fp16).
    Multiply by the elements of every GEMM input that is quantized (activations, weights when not
    cached, output gradients) and by the recipe's low-precision share (`low_precision_fraction`)."""
    r = get_recipe(precision)
    return r.per_arch(r.quant_hbm_bytes_per_element, gpu)


def weight_copy_bytes_per_param(precision: str, gpu: GPU | None = None) -> float:
    """Bytes per parameter of the low-precision weight copies kept in HBM for the step (beyond the bf16
    weights): 0 for bf16, 1 or 2 for FP8 (transpose on Hopper/Ada), 2.06 for MXFP8, 1.125 for NVFP4,
    counting the recipe's bf16 layers (which keep no copy)."""
    r = get_recipe(precision)
    return r.per_arch(r.weight_copy_bytes_per_param, gpu) * (1 - r.bf16_layer_fraction)


def saved_input_bytes_per_element(precision: str, gpu: GPU | None = None) -> float:
    """Bytes per element of a linear layer's input kept for the backward where the framework keeps it
    quantized (Transformer Engine): 2 for 16-bit recipes, ~1 for FP8, ~0.56 for NVFP4; the recipe's
    bf16 layers keep 2."""
    r = get_recipe(precision)
    lp = low_precision_fraction(precision)
    return lp * r.per_arch(r.saved_input_bytes_per_element, gpu) + (1 - lp) * 2.0


def low_precision_fraction(precision: str) -> float:
    """Share of the linear-layer GEMM FLOPs that run in the recipe's low-precision type (0 for 16-bit)."""
    r = get_recipe(precision)
    return 0.0 if r.gemm_dtype in ("bf16", "fp16") else 1.0 - r.bf16_layer_fraction


def resolve_model(value: Any) -> Any:
    """A preset name, `{preset: name, **overrides}` or `{hf_config: path}` -> explicit fields.

    Anything else is returned unchanged for pydantic to validate.
    """
    if isinstance(value, str):
        value = {"preset": value}
    if not isinstance(value, dict):
        return value
    if "hf_config" in value:
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
    # The bounded reader (regular files only, size checked before reading) and the strict parser
    # (duplicate keys rejected at the second key's line, nesting limited).
    doc = parse_yaml(read_text(path, MAX_YAML_BYTES, what="calibrated catalog"), path) or {}
    # Nothing may be silently ignored: a file without `gpus:` (a problem file, a typo) is an error.
    if not isinstance(doc, dict):
        raise InputError(f"malformed calibrated catalog: expected a mapping with `gpus:`, got a {type(doc).__name__}",
                         source=path)
    extra = [k for k in doc if k != "gpus"]
    if extra:
        raise InputError(f"unknown field in a calibrated catalog ({closest(str(extra[0]), ['gpus'])}; a catalog "
                         "holds only `gpus: {<gpu>: {efficiency: {...}}}`)", source=path, field=str(extra[0]))
    if not isinstance(doc.get("gpus"), dict) or not doc["gpus"]:
        raise InputError("malformed calibrated catalog: `gpus` must map GPU names to {efficiency: {...}}",
                         source=path, field="gpus")
    for k in doc["gpus"]:
        if _aliases().get(_norm(str(k))) is None:
            raise InputError(f"unknown GPU {k!r} ({closest(_norm(str(k)), _aliases())})", source=path,
                             field=f"gpus.{k}")
    out: dict[str, Efficiency] = {}
    try:
        for k, v in (doc.get("gpus") or {}).items():
            try:
                out[_aliases().get(_norm(k), k)] = Efficiency(**v["efficiency"])
            except ValidationError as exc:
                # Not str(exc): it would repr the whole input, which a YAML alias bomb makes endless.

                loc, msg = format_validation_error(exc, Efficiency)
                raise InputError(f"malformed calibrated catalog: {msg}", source=path,
                                 field=".".join(x for x in ("gpus", str(k), "efficiency", loc) if x)) from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"malformed calibrated catalog ({exc.__class__.__name__}: {exc})".splitlines()[0], source=path) from None
    return out


def load_overlay(path: str) -> dict[str, Efficiency]:
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        # No source: the error is attributed to the problem file that names the catalog.
        raise InputError(f"calibrated catalog {path!r} not found", field="cluster.catalog")
    st = check_input_file(p, expected="a calibrated catalog file")  # FIFO: refused
    return _overlay_cached(str(p.resolve()), st.st_mtime)
