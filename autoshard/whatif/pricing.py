"""Pricing: cloud and owned cost, capex, facility power and energy of one option; the study's priced
assumptions in words."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..catalog import get_gpu, get_topology, gpu_ids
from ..spec import TopologyLevel
from .goodput import reliability_figure, failure_rate, reliability_defaults
from .schema import SPOT_DISCOUNT, Option, PricingSpec, Study, StudySpec

NODE_OVERHEAD_FRACTION = 0.30  # assumption: CPUs, NICs, switches, fans as a share of GPU TDP. A DGX H100
# draws 10.2 kW at most (datasheet) for 8 x 700 W GPUs (+82% at peak); average draw is well below peak.
NODE_OVERHEAD_FRACTION_GPU = {"gb200": 0.10}  # catalog tdp_w of GB200 is already the rack share (Grace, NVSwitch)
USD_PER_PORT_PER_GB_S = 100.0  # assumption: scale-out fabric (NIC share, switch ports, optics) ~$5,000 per
# 400 Gb/s (50 GB/s) GPU port, about 10-15% of an H100 cluster's capex; only for clusters of more than one node.


# =============================================================================================
# Cost, energy, Pareto front, purchase optimizer
# =============================================================================================


def _gpu_value(table: Mapping[str, float], gpu: str) -> float | None:
    for k, v in table.items():
        if get_gpu(k).id == gpu:
            return float(v)
    return None


def node_overhead_w(pricing: PricingSpec, gpu: str) -> float:
    v = pricing.node_overhead_w
    if isinstance(v, dict):
        x = _gpu_value(v, gpu)
        if x is not None:
            return x
    elif v is not None:
        return float(v)
    return get_gpu(gpu).tdp_w * NODE_OVERHEAD_FRACTION_GPU.get(gpu, NODE_OVERHEAD_FRACTION)


def gpu_power_w(pricing: PricingSpec, gpu: str, figure: str | None = None) -> float:
    """All-in IT power per GPU (before PUE) under a power figure (default: the study's
    `pricing.power_figure`): `catalog` is tdp_w + node overhead; another name is that source's
    `system_power_w` from the catalog, where the GPU has one (else the catalog figure)."""
    figure = figure or pricing.power_figure
    g = get_gpu(gpu)
    if figure != "catalog" and figure in g.system_power_w:
        return float(g.system_power_w[figure])
    return g.tdp_w + node_overhead_w(pricing, gpu)


def spot_discount(pricing: PricingSpec, gpu: str) -> float:
    v = pricing.spot_discount
    if isinstance(v, dict):
        x = _gpu_value(v, gpu)
        return SPOT_DISCOUNT if x is None else x
    return float(v)


def _topology_levels(study: Study, option: Option) -> list[TopologyLevel]:
    if option.topology in study.spec.networks:
        return list(study.spec.networks[option.topology].levels)
    return list(get_topology(option.topology).levels)


def port_price_usd(study: Study, option: Option) -> float:
    """Scale-out capex per GPU: 0 on a single node, else the study's price or the default rule."""
    levels = _topology_levels(study, option)
    if option.num_gpus <= levels[0].size or len(levels) < 2:
        return 0.0
    net = study.spec.networks.get(option.topology)
    if net is not None and net.usd_per_network_port is not None:
        return net.usd_per_network_port
    if study.spec.pricing.usd_per_network_port is not None:
        return study.spec.pricing.usd_per_network_port
    return USD_PER_PORT_PER_GB_S * levels[1].bandwidth_gb_per_s


def price_option(study: Study, option: Option, wall_s: float, *, power_figure: str | None = None) -> dict[str, float]:
    """Cost (USD), capex, energy (MWh) and facility power (MW) of running `option` for `wall_s`.

    cloud: the on-demand $/GPU-hour; spot: that rate less `spot_discount` (the time lost to
    preemptions is in `wall_s`); own: amortized capex + electricity."""
    pr = study.spec.pricing
    gpu = get_gpu(option.gpu)
    hours = wall_s / 3600.0
    per_gpu_w = gpu_power_w(pr, option.gpu, power_figure)
    power_w = option.num_gpus * per_gpu_w * pr.pue
    energy_kwh = power_w * hours / 1000.0
    out = {"power_mw": power_w / 1e6, "energy_mwh": energy_kwh / 1000.0}
    if option.mode in ("cloud", "spot"):
        rate = _gpu_value(pr.usd_per_gpu_hour, option.gpu) or gpu.price.usd_per_gpu_hour
        if option.mode == "spot":
            out["spot_discount"] = spot_discount(pr, option.gpu)
            rate *= 1.0 - out["spot_discount"]
        out.update(cost_usd=rate * option.num_gpus * hours, capex_usd=0.0, cloud_usd=rate * option.num_gpus * hours,
                   amortized_capex_usd=0.0, power_usd=0.0, usd_per_gpu_hour=rate)
    else:
        purchase = _gpu_value(pr.purchase_usd_per_gpu, option.gpu) or gpu.price.purchase_usd
        node = _topology_levels(study, option)[0].size
        nodes = math.ceil(option.num_gpus / node)
        capex = option.num_gpus * purchase + nodes * pr.usd_per_node + option.num_gpus * port_price_usd(study, option)
        amort = capex * (hours / 24.0) / (pr.amortization_years * 365.0)
        power_usd = energy_kwh * pr.usd_per_kwh
        out.update(cost_usd=amort + power_usd, capex_usd=capex, cloud_usd=0.0, amortized_capex_usd=amort,
                   power_usd=power_usd, purchase_usd_per_gpu=purchase)
    return out


def default_notes(spec: StudySpec, options: Sequence[Option]) -> list[str]:
    notes = []
    pr = spec.pricing
    modes = {o.mode for o in options}
    for gid in sorted({o.gpu for o in options}, key=lambda g: gpu_ids().index(g) if g in gpu_ids() else 999):
        g = get_gpu(gid)
        if "cloud" in modes and _gpu_value(pr.usd_per_gpu_hour, gid) is None:
            notes.append(f"{gid}: cloud price ${g.price.usd_per_gpu_hour:g}/GPU-h from the catalog "
                         f"({g.sources.get('price', 'no source')})")
        if "own" in modes and _gpu_value(pr.purchase_usd_per_gpu, gid) is None:
            notes.append(f"{gid}: purchase price ${g.price.purchase_usd:,.0f}/GPU from the catalog")
        if pr.power_figure != "catalog" and pr.power_figure in g.system_power_w:
            notes.append(f"{gid}: {g.system_power_w[pr.power_figure]:,.0f} W per GPU all-in (power figure "
                         f"'{pr.power_figure}': {g.sources.get('system_power_w', 'catalog')}); the catalog figure "
                         f"would be {g.tdp_w + node_overhead_w(pr, gid):,.0f} W")
        else:
            notes.append(f"{gid}: {g.tdp_w:g} W TDP ({g.sources.get('tdp_w', 'catalog')}) + "
                         f"{node_overhead_w(pr, gid):g} W node overhead per GPU"
                         + "".join(f"; the '{k}' figure would be {v:,.0f} W all-in" for k, v in g.system_power_w.items()))
        if "spot" in modes:
            notes.append(f"{gid}: spot price {100 * spot_discount(pr, gid):g}% below the cloud rate"
                         + (" (GPU buying guides put spot savings at 60-90% vs on-demand; their worked example: 70%)"
                            if not isinstance(pr.spot_discount, dict) and pr.spot_discount == SPOT_DISCOUNT else
                            " (study)"))
    if "own" in modes:
        notes.append(f"owned: ${pr.usd_per_kwh:g}/kWh, PUE {pr.pue:g}, {pr.amortization_years:g}-year amortization, "
                     f"${pr.usd_per_node:,.0f}/node; scale-out port "
                     + (f"${pr.usd_per_network_port:,.0f}/GPU" if pr.usd_per_network_port is not None else
                        f"${USD_PER_PORT_PER_GB_S:g} per GB/s of per-GPU scale-out bandwidth (assumption)"))
    else:
        notes.append(f"facility: PUE {pr.pue:g} (energy only; cloud rates include power)")
    rel = spec.reliability
    if rel.enabled:
        d = reliability_defaults()
        notes.append(f"failures: {failure_rate(rel, 'h100-sxm'):.3g}/GPU-h"
                     + (" (Llama 3 paper: 419 unexpected interruptions in 54 days on 16,384 H100)"
                        if rel.failures_per_gpu_hour is None else " (study)")
                     + f"; restart {reliability_figure(rel, 'restart_s'):g} s + checkpoint read; checkpoint "
                     f"{reliability_figure(rel, 'checkpoint_bytes_per_param'):g} B/param at "
                     f"{reliability_figure(rel, 'storage_gb_per_s_per_gpu'):g} GB/s per GPU "
                     f"(min {reliability_figure(rel, 'storage_min_gb_per_s'):g} GB/s)"
                     + ("" if rel.storage_gb_per_s_per_gpu is not None else
                        f" ({d['storage_source'].strip()[:60]}...)"))
    else:
        notes.append("reliability disabled: no failure losses")
    if "spot" in modes:
        notes.append(f"spot preemptions: {reliability_figure(rel, 'spot_preemptions_per_gpu_hour'):.3g}/GPU-h on top of failures, "
                     "each costing a restart and half a checkpoint interval"
                     + (" (AWS Spot Instance Advisor's top bucket, > 20% of instances reclaimed per month, on 8-GPU "
                        "instances; assumption)" if rel.spot_preemptions_per_gpu_hour is None else " (study)"))
    loss = reliability_figure(rel, "other_loss_fraction")
    if loss:
        notes.append(f"other losses outside the cost model (input stalls, stragglers, congestion): {100 * loss:g}% "
                     "of wall time (study)")
    if spec.fleet:
        notes.append("fleet: each job runs on one pool (no job spans GPU generations or networks); a pool runs "
                     "its jobs one after another; owned pools' running cost is energy + amortized capex for the "
                     "time used; a candidate pool's capex counts once in the scenarios that buy it")
    else:
        notes.append("one purchase per decision: a mix of GPU types is a `fleet:` of pools")
    return notes
