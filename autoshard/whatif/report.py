"""The what-if report: `report.md`, a self-contained `report.html` and PNG plots.

`write_report(doc, out_dir)` takes the `results.json` document of `autoshard.whatif` and
writes, per workload: time vs cost with the Pareto front and the constraints, cost and
energy breakdown bars, where each option's step time goes, the sensitivity of the step time
to faster hardware, and (per model and training setup) tokens/s, MFU and goodput against
the GPU count. matplotlib is imported on use (Agg backend), never at module import.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

from ..fileio import atomic_write, dumps_json
from .schema import fmt_tokens
from .sensitivity import BINDING_MIN_GAIN_PCT
import warnings

TIME_KEYS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "zero3_comm", "host", "offload",
             "pipeline_bubble", "dp_comm", "optimizer")
TIME_LABELS = {"compute": "compute", "recompute": "recompute", "tp_comm": "TP comm", "cp_comm": "CP comm",
               "ep_comm": "EP comm", "pp_comm": "PP comm", "zero3_comm": "ZeRO-3 gathers",
               "host": "host time", "offload": "host offload", "pipeline_bubble": "pipeline bubble", "dp_comm": "DP comm (exposed)", "optimizer": "optimizer step"}
# One distinct colour per step-time part (12 parts: tab10's ten and two more, never a repeat; `cmap(i % 10)`
# painted compute and the exposed DP communication the same blue).
TIME_COLORS = {"compute": "#1f77b4", "recompute": "#ff7f0e", "tp_comm": "#2ca02c", "cp_comm": "#d62728",
               "ep_comm": "#9467bd", "pp_comm": "#8c564b", "zero3_comm": "#e377c2", "host": "#7f7f7f",
               "offload": "#bcbd22", "pipeline_bubble": "#17becf", "dp_comm": "#e7ba52", "optimizer": "#393b79"}
GAINS = (("gain_internode_2x_pct", "2x inter-node"), ("gain_nvlink_2x_pct", "2x NVLink"),
         ("gain_hbm_plus_pct", "+HBM"), ("gain_fp8_pct", "fp8"))
MAX_BARS = 28  # options shown in bar charts (Pareto, recommended and best by time first)


# ---- formatting ---------------------------------------------------------------------------------


def money(x: float | None, digits: int = 3) -> str:
    """`$12.3M`, `$866k`, `$600` (`digits` significant digits)."""
    if x is None:
        return "-"
    a = abs(x)
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if a >= div:
            return f"${x / div:.{digits}g}{unit}"
    return f"${x:.0f}" if digits <= 3 else f"${x:,.{max(0, digits - 3)}f}"


def _distinct(fmt: Any, x: float, limit: float, last: tuple[str, str]) -> tuple[str, str]:
    """`fmt(x, d)` and `fmt(limit, d)` with the fewest digits d >= 3 that tell them apart (a value just
    over its limit must not print as equal to it: `$12.04M > budget $12M`, not `$12M > budget $12M`)."""
    for d in range(3, 10):
        a, b = fmt(x, d), fmt(limit, d)
        if a != b or x == limit:
            return a, b
    return last


def money_vs(x: float, limit: float) -> tuple[str, str]:
    """`money` of a value and of the limit it is compared with, distinct whenever they differ."""
    return _distinct(money, x, limit, (f"${x:,.2f}", f"${limit:,.2f}"))


def power(mw: float | None, digits: int | None = None) -> str:
    """Facility power: `4.85 MW`, or in kW below 1 MW (`9.46 kW` for an 8-GPU box, not `0.01 MW`)."""
    if mw is None or (isinstance(mw, float) and math.isnan(mw)):
        return "-"
    if abs(mw) < 1:
        return f"{mw * 1e3:.{digits or 3}g} kW"
    return f"{mw:.2f} MW" if digits is None else f"{mw:.{digits}g} MW"


def power_cap(mw: float) -> str:
    """A power cap as given: `5 MW`, `300 kW`."""
    return f"{mw * 1e3:g} kW" if abs(mw) < 1 else f"{mw:g} MW"


def power_vs(mw: float, cap: float) -> tuple[str, str]:
    """`power` of a value and `power_cap` of its cap, with more digits when they would print alike."""
    a, b = power(mw), power_cap(cap)
    if a.split()[1] != b.split()[1] or float(a.split()[0]) != float(b.split()[0]) or mw == cap:
        return a, b
    return _distinct(power, mw, cap, (f"{mw * 1e6:,.0f} W", f"{cap * 1e6:,.0f} W"))


def num(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 1e6:
        for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
            if a >= div:
                return f"{x / div:.{digits}g}{unit}"
    if a >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def fixed(x: float | None, spec: str) -> str:
    """`format(x, spec)`, with "-" for a missing value and "never" for an infinite one
    (a cluster that does not fail has no MTBF or checkpoint interval)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "never" if math.isinf(x) else format(x, spec)


def span_days(row: dict[str, Any], key: str) -> str:
    """`low-high` of a row's `<key>_low` / `<key>_high` in days, "-" when it has none."""
    lo, hi = row.get(f"{key}_low"), row.get(f"{key}_high")
    return "-" if lo is None or hi is None else f"{lo:.1f}-{hi:.1f}"


def span_money(row: dict[str, Any], key: str) -> str:
    """`low-high` of a row's `<key>_low` / `<key>_high` in dollars, "-" when it has none."""
    lo, hi = row.get(f"{key}_low"), row.get(f"{key}_high")
    return "-" if lo is None or hi is None else f"{money(lo)}-{money(hi)}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def gain(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1f}%"


def label(row: dict[str, Any], with_topology: bool = False, with_mode: bool = True) -> str:
    s = f"{row['gpu']} x{row['num_gpus']}"
    if with_topology:
        s += f" {row['topology']}"
    if with_mode:
        s += f" ({row['mode']})"
    return s


# ---- plots ------------------------------------------------------------------------------------


def _plt():
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 11, "axes.labelsize": 9, "legend.fontsize": 8,
                         "figure.dpi": 110, "savefig.dpi": 110, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _colors(gpus: Sequence[str]) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    return {g: cmap(i % 10) for i, g in enumerate(gpus)}


def _plain(v: float) -> str:
    """A tick label as a plain number: 20, 50, 100, 1,000, 0.5 (never 2x10^1)."""
    return f"{v:,.0f}" if v >= 10 else f"{v:g}"


def _log_if_wide(ax, axis: str, values: Sequence[float], ratio: float = 15.0, fmt: Any = None) -> None:
    """A log scale when the values span more than `ratio`, its ticks at 1, 2 and 5 of each decade
    labelled as plain numbers (`fmt`, default `_plain`); no minor-tick labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: PLC0415

    vals = [v for v in values if v and v > 0]
    if vals and max(vals) / min(vals) > ratio:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        a = ax.xaxis if axis == "x" else ax.yaxis
        a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        a.set_major_formatter(FuncFormatter(lambda v, _p: (fmt or _plain)(v)))
        a.set_minor_formatter(NullFormatter())


def _short_violations(r: dict) -> str:
    """`misses deadline, over budget` for a row that breaks constraints; '' for one that meets them."""
    words = []
    for v in r.get("violations") or []:
        words.append("misses deadline" if "deadline" in v else "over capex budget" if "capex" in v else
                     "over budget" if "budget" in v else "over power cap" if "power" in v else v)
    return ", ".join(words)


def plot_time_cost(rows: list[dict], gpus: list[str], constraints: dict, title: str) -> bytes:
    plt = _plt()
    from matplotlib.lines import Line2D  # noqa: PLC0415

    feas = [r for r in rows if r.get("feasible")]
    colors = _colors(gpus)
    markers = {"cloud": "o", "own": "s", "spot": "^"}
    fig, ax = plt.subplots(figsize=(9.5, 6))
    for r in feas:
        ax.scatter(r["time_to_train_days"], r["cost_usd"], color=colors[r["gpu"]], marker=markers[r["mode"]],
                   s=36, alpha=0.85 if r.get("meets_constraints") else 0.35, edgecolors="none", zorder=3)
    front = sorted((r for r in feas if r.get("pareto")), key=lambda r: r["time_to_train_days"])
    if front:
        xs = [r["time_to_train_days"] for r in front]
        ys = [r["cost_usd"] for r in front]
        ax.step(xs, ys, where="post", color="black", lw=1.2, zorder=2)
        ax.scatter(xs, ys, facecolors="none", edgecolors="black", s=110, lw=1.2, zorder=4)
    labels: list[tuple[float, float, str, dict]] = []  # placed last, without overlaps
    multi_mode = len({r["mode"] for r in feas}) > 1
    for r in sorted(feas, key=lambda r: (not r.get("recommended"), not r.get("pareto"), r["time_to_train_days"])):
        if not (r.get("pareto") or r.get("recommended")) and len(feas) > 40:
            continue  # a larger sweep labels its front only
        why = _short_violations(r)
        strong = r.get("pareto") or r.get("recommended")
        labels.append((r["time_to_train_days"], r["cost_usd"], f"{r['gpu']} x{r['num_gpus']}"
                       + (f" {r['mode']}" if multi_mode else "")
                       + (f" ({why})" if why else ""), {"fontsize": 7 if strong else 6.5,
                                                         "color": "0.1" if strong else "0.45"}))
    rec = [r for r in feas if r.get("recommended")]
    for r in rec:
        ax.scatter(r["time_to_train_days"], r["cost_usd"], marker="*", s=420, color="gold", edgecolors="black",
                   lw=1.0, zorder=5)
    xs_all = [r["time_to_train_days"] for r in feas]
    ys_all = [r["cost_usd"] for r in feas]
    off: list[str] = []
    dl, bu = constraints.get("deadline_days"), constraints.get("budget_usd")
    # A constraint far beyond the data would squash the points: draw it only when it is near.
    show_dl = bool(dl) and bool(xs_all) and dl <= 3 * max(xs_all)
    show_bu = bool(bu) and bool(ys_all) and bu <= 3 * max(ys_all)
    if dl and not show_dl:
        off.append(f"deadline {dl:g} d (off chart)")
    if bu and not show_bu:
        off.append(f"budget {money(bu)} (off chart)")
    _log_if_wide(ax, "x", xs_all + ([dl] if show_dl else []))
    _log_if_wide(ax, "y", ys_all + ([bu] if show_bu else []), fmt=lambda v: money(v) if v > 0 else "0")
    if show_dl:
        ax.axvline(dl, color="tab:red", ls="--", lw=1)
        ax.annotate(f"deadline {dl:g} d", (dl, 1), xycoords=("data", "axes fraction"), xytext=(-4, -6),
                    textcoords="offset points", rotation=90, ha="right", va="top", color="tab:red", fontsize=8)
    if show_bu:
        ax.axhline(bu, color="tab:purple", ls="--", lw=1)
        ax.annotate(f"budget {money(bu)}", (0, bu), xycoords=("axes fraction", "data"), xytext=(6, 4),
                    textcoords="offset points", ha="left", va="bottom", color="tab:purple", fontsize=8)
    if constraints.get("power_cap_mw"):
        off.append(f"power cap {power_cap(constraints['power_cap_mw'])}")
    if constraints.get("capex_budget_usd"):
        off.append(f"capex budget {money(constraints['capex_budget_usd'])}")
    if off:
        ax.text(1.02, 0.0, "constraints:\n" + "\n".join(off), transform=ax.transAxes, ha="left", va="bottom",
                fontsize=8, color="0.3", bbox={"boxstyle": "round", "fc": "white", "ec": "0.8"})
    ax.set_xlabel("time to train (days, incl. failure losses)")
    ax.set_ylabel("cost to train (USD)")
    if ax.get_yscale() != "log":
        ax.yaxis.set_major_formatter(_money_formatter())
    ax.set_title(title)
    handles = [Line2D([], [], ls="", marker="o", color=colors[g], label=g) for g in gpus
               if any(r["gpu"] == g for r in feas)]
    modes = sorted({r["mode"] for r in feas})
    if len(modes) > 1:
        handles += [Line2D([], [], ls="", marker=markers[m], color="0.4", label=m) for m in modes]
    handles.append(Line2D([], [], color="black", marker="o", mfc="none",
                          label="Pareto front (of the options\nmeeting every constraint)"))
    if rec:
        handles.append(Line2D([], [], ls="", marker="*", ms=14, color="gold", mec="black", label="recommended"))
    if any(not r.get("meets_constraints") for r in feas):
        handles.append(Line2D([], [], ls="", marker="o", color="0.4", alpha=0.35,
                              label="breaks a constraint\n(faded; named in its label)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    _place_labels(fig, ax, labels)
    png = _png(fig)
    plt.close(fig)
    return png


def _place_labels(fig, ax, labels: Sequence[tuple[float, float, str, dict]]) -> None:
    """Label points in order of importance, each at the first of a few offsets around its point where
    it overlaps no earlier label and stays inside the axes; a label with no free place is left out."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    offsets = ((7, 4, "left", "bottom"), (7, -4, "left", "top"), (-7, 4, "right", "bottom"),
               (-7, -4, "right", "top"), (7, 13, "left", "bottom"), (7, -13, "left", "top"),
               (-7, 13, "right", "bottom"), (-7, -13, "right", "top"))
    placed: list[Any] = []
    for x, y, text, style in labels:
        for dx, dy, ha, va in offsets:
            t = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), ha=ha, va=va, zorder=6,
                            **style)
            box = t.get_window_extent(renderer).expanded(1.03, 1.1)
            inside = (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1)
            if inside and not any(box.overlaps(b) for b in placed):
                placed.append(box)
                break
            t.remove()


def _money_formatter():
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    return FuncFormatter(lambda v, _pos: money(v) if v > 0 else "0")


def select_bars(rows: list[dict], limit: int = MAX_BARS) -> list[dict]:
    """The options worth a bar: recommended, Pareto, meeting constraints by time, then the rest."""
    feas = [r for r in rows if r.get("feasible")]
    ranked = sorted(feas, key=lambda r: (not r.get("recommended"), not r.get("pareto"),
                                         not r.get("meets_constraints"), r["time_to_train_days"], r["option"]))
    keep = ranked[:limit]
    return sorted(keep, key=lambda r: (r["cost_usd"], r["option"]))


def plot_cost_energy(rows: list[dict], title: str, with_topology: bool) -> bytes:
    plt = _plt()
    sel = select_bars(rows)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 0.32 * len(sel) + 1.8), sharey=True,
                                   gridspec_kw={"width_ratios": [1.4, 1]})
    y = list(range(len(sel)))
    rental = "rental (cloud or spot)" if any(r["mode"] == "spot" for r in sel) else "cloud rental"
    parts = (("cloud_usd", rental, "tab:blue"),
             ("amortized_capex_usd", "capex (amortized share)", "tab:orange"),
             ("power_usd", "electricity", "tab:green"))
    left = [0.0] * len(sel)
    misses = [not r.get("meets_constraints") for r in sel]
    for key, name, color in parts:
        vals = [r.get(key) or 0.0 for r in sel]
        if any(vals):
            ax1.barh(y, vals, left=left, color=color, label=name, height=0.7)
            for yi, v, lft, miss in zip(y, vals, left, misses):  # hatched and faded: misses a constraint
                if miss and v:
                    ax1.barh([yi], [v], left=[lft], color="white", alpha=0.45, height=0.7, hatch="///",
                             edgecolor="0.3", lw=0)
            left = [a + b for a, b in zip(left, vals)]
    for yi, r in zip(y, sel):
        why = _short_violations(r)
        ax1.annotate(money(r["cost_usd"]) + (f"  {why}" if why else ""), (r["cost_usd"], yi), xytext=(3, 0),
                     textcoords="offset points", va="center", fontsize=7, color="tab:red" if why else "black")
    ax1.set_xlim(0, max(left) * (1.75 if any(misses) else 1.18) if left and max(left) > 0 else 1)
    ax1.xaxis.set_major_formatter(_money_formatter())
    ax1.set_xlabel("cost to train (USD)")
    ax1.set_yticks(y)
    ax1.set_yticklabels([("* " if r.get("recommended") else "") + label(r, with_topology) for r in sel])
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    handles, labels = ax1.get_legend_handles_labels()
    if any(misses):
        handles.append(Patch(facecolor="0.85", hatch="///", edgecolor="0.3", lw=0))
        labels.append("hatched: misses a constraint (named in red)")
    if any(r.get("recommended") for r in sel):
        handles.append(Line2D([], [], ls=""))
        labels.append("* recommended")
    fig.legend(handles, labels, loc="lower center", ncol=min(len(handles), 5), frameon=False,
               bbox_to_anchor=(0.5, -0.01))
    ax1.set_title("cost")
    e = [r["energy_mwh"] for r in sel]
    ax2.barh(y, e, color="tab:olive", height=0.7)
    for yi, v, miss in zip(y, e, misses):
        if miss:
            ax2.barh([yi], [v], color="white", alpha=0.45, height=0.7, hatch="///", edgecolor="0.3", lw=0)
    for yi, v in zip(y, e):
        ax2.annotate(f"{v:,.0f}" if v >= 10 else f"{v:.2g}", (v, yi), xytext=(3, 0), textcoords="offset points",
                     va="center", fontsize=7)
    ax2.set_xlim(0, max(e) * 1.2 if e and max(e) > 0 else 1)
    from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: PLC0415

    ax2.xaxis.set_major_locator(MaxNLocator(nbins=5))
    ax2.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v / 1000:g}k" if v >= 1000 else f"{v:g}"))
    ax2.set_xlabel("energy (MWh, facility incl. PUE)")
    ax2.set_title("energy")
    for ax in (ax1, ax2):
        ax.grid(axis="y", visible=False)
    ax1.invert_yaxis()
    fig.suptitle(title, y=1.0)
    fig.tight_layout(rect=(0, 0.05 if len(sel) < 8 else 0.03, 1, 1))
    png = _png(fig)
    plt.close(fig)
    return png


def _hardware_rows(rows: list[dict]) -> list[dict]:
    """One row per hardware option (the pricing mode does not change the plan)."""
    seen: dict[str, dict] = {}
    for r in rows:
        if r.get("feasible"):
            hw = f"{r['gpu']}/{r['num_gpus']}/{r['topology']}"
            if hw not in seen or r.get("recommended"):
                seen[hw] = r
    return list(seen.values())


def _bar_rows(rows: list[dict], gpu_order: list[str]) -> list[dict]:
    """One row per hardware option (at most MAX_BARS), ordered by GPU, topology and count."""
    hw = _hardware_rows(rows)
    if len(hw) > MAX_BARS:
        keep = {id(r) for r in select_bars(hw, MAX_BARS)}
        hw = [r for r in hw if id(r) in keep]
    hw.sort(key=lambda r: (gpu_order.index(r["gpu"]) if r["gpu"] in gpu_order else 99, r["topology"], r["num_gpus"]))
    return hw


def plot_step_breakdown(rows: list[dict], title: str, with_topology: bool, gpu_order: list[str]) -> bytes:
    plt = _plt()
    hw = _bar_rows(rows, gpu_order)
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(hw) + 1.9))
    y = list(range(len(hw)))
    left = [0.0] * len(hw)
    for key in TIME_KEYS:
        vals = []
        for r in hw:
            bd = r.get("time_breakdown_s") or {}
            tot = sum(max(0.0, v) for v in bd.values()) or 1.0
            vals.append(100.0 * max(0.0, bd.get(key, 0.0)) / tot)
        if any(v > 0.05 for v in vals):
            ax.barh(y, vals, left=left, color=TIME_COLORS[key], label=TIME_LABELS[key], height=0.7)
            left = [a + b for a, b in zip(left, vals)]
    for yi, r in zip(y, hw):
        ax.annotate(f"{r['step_time_s']:.3g} s, MFU {100 * r['mfu']:.0f}%", (100, yi), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=7)
    ax.set_xlim(0, 100)
    ax.set_yticks(y)
    ax.set_yticklabels([label(r, with_topology, with_mode=False) for r in hw])
    ax.invert_yaxis()
    ax.set_xlabel("share of the step time (%), critical path of the slowest pipeline stage")
    ax.grid(axis="y", visible=False)
    ax.legend(loc="upper left", bbox_to_anchor=(1.16, 1.0), frameon=False)
    ax.set_title(title)
    png = _png(fig)
    plt.close(fig)
    return png


def plot_scaling(rows: list[dict], title: str, gpu_order: list[str]) -> bytes:
    plt = _plt()
    hw = _hardware_rows(rows)
    series: dict[tuple[str, str], list[dict]] = {}
    for r in hw:
        series.setdefault((r["gpu"], r["topology"]), []).append(r)
    many_topos = len({t for _, t in series}) > len({g for g, _ in series})
    colors = _colors(gpu_order)
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.4))
    topo_idx: dict[str, int] = {}
    for (g, t), pts in sorted(series.items(), key=lambda kv: (gpu_order.index(kv[0][0]) if kv[0][0] in gpu_order
                                                              else 99, kv[0][1])):
        pts.sort(key=lambda r: r["num_gpus"])
        ls = styles[topo_idx.setdefault(t, len(topo_idx)) % 4] if many_topos else "-"
        name = f"{g} ({t})" if many_topos else g
        n = [r["num_gpus"] for r in pts]
        axes[0].plot(n, [r["tokens_per_s"] for r in pts], ls=ls, marker="o", ms=4, color=colors[g], label=name)
        if len(pts) > 1:
            base = pts[0]["tokens_per_s"] / pts[0]["num_gpus"]
            axes[0].plot([n[0], n[-1]], [base * n[0], base * n[-1]], ls=":", lw=0.8, color=colors[g], alpha=0.6)
        axes[1].plot(n, [100 * r["mfu"] for r in pts], ls=ls, marker="o", ms=4, color=colors[g], label=name)
        axes[2].plot(n, [100 * r["goodput"] for r in pts], ls=ls, marker="o", ms=4, color=colors[g], label=name)
    allg = [r["num_gpus"] for r in hw]
    for ax in axes:
        _log_if_wide(ax, "x", allg, ratio=6.0)
        ax.set_xlabel("GPUs")
    if axes[0].get_xscale() == "log":
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: PLC0415

        for ax in axes:
            ax.xaxis.set_major_locator(LogLocator(base=2, subs=(1.0,)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
    _log_if_wide(axes[0], "y", [r["tokens_per_s"] for r in hw], fmt=lambda v: num(v, 3) if v > 0 else "0")
    if axes[0].get_yscale() != "log":
        from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

        axes[0].yaxis.set_major_formatter(FuncFormatter(lambda v, _p: num(v, 3) if v > 0 else "0"))
    axes[0].set_ylabel("tokens/s (dotted: linear scaling)")
    axes[0].set_title("throughput")
    axes[1].set_ylabel("MFU (%)")
    axes[1].set_ylim(0, max([100 * r["mfu"] for r in hw] + [10]) * 1.15)
    axes[1].set_title("model FLOPs utilization")
    axes[2].set_ylabel("effective training-time ratio (%)")
    axes[2].set_title("goodput after failures")
    lo = min([100 * r["goodput"] for r in hw] + [100])
    axes[2].set_ylim(max(0, lo - max(2, (100 - lo) * 0.3)), 100.5)
    axes[2].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    png = _png(fig)
    plt.close(fig)
    return png


def plot_sensitivity(rows: list[dict], title: str, with_topology: bool, gpu_order: list[str]) -> bytes:
    plt = _plt()
    hw = _bar_rows(rows, gpu_order)
    data = [[r.get(k) for k, _ in GAINS] for r in hw]
    vals = [v for row in data for v in row if v is not None]
    vmax = max([abs(v) for v in vals] + [1.0])
    fig, ax = plt.subplots(figsize=(8.2, 0.3 * len(hw) + 1.9))
    import numpy as np  # noqa: PLC0415

    arr = np.array([[np.nan if v is None else v for v in row] for row in data], dtype=float)
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="0.9")
    im = ax.imshow(np.ma.masked_invalid(arr), cmap=cmap, vmin=-vmax, vmax=vmax, aspect="auto")
    for i, row in enumerate(data):
        for j, v in enumerate(row):
            dark = v is not None and abs(v) > 0.6 * vmax
            ax.text(j, i, "n/a" if v is None else f"{v:+.1f}%", ha="center", va="center", fontsize=7,
                    color="white" if dark else "0.15")
    ax.set_xticks(range(len(GAINS)))
    ax.set_xticklabels([n for _, n in GAINS])
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(hw)))
    ax.set_yticklabels([f"{label(r, with_topology, with_mode=False)}  [{r.get('binding') or '-'}]" for r in hw])
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="step-time reduction (%)", shrink=0.8)
    ax.set_title(title + f"\n[binding: the resource whose relaxation cuts the step by >= {BINDING_MIN_GAIN_PCT:g}%, "
                 "else none]", pad=24)
    png = _png(fig)
    plt.close(fig)
    return png


# ---- documents ------------------------------------------------------------------------------------


class _Doc:
    """Blocks rendered both as Markdown and as HTML."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any]] = []

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def ul(self, items: Sequence[str]) -> None:
        self.blocks.append(("ul", list(items)))

    def table(self, head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        self.blocks.append(("table", (list(head), [list(r) for r in rows])))

    def img(self, name: str, alt: str, png: bytes) -> None:
        self.blocks.append(("img", (name, alt, png)))

    def markdown(self) -> str:
        return "\n\n".join(_block_markdown(kind, v) for kind, v in self.blocks) + "\n"

    def html(self, title: str) -> str:
        """The same blocks as HTML: text, lists and tables are report.md's Markdown rendered by
        markdown-it-py (raw HTML in the text is escaped, not passed through); the plots are embedded
        as data URIs with their captions."""
        e = html.escape
        body = []
        for kind, v in self.blocks:
            if kind == "img":
                data = base64.b64encode(v[2]).decode("ascii")
                body.append(f'<figure><img alt="{e(v[1])}" src="data:image/png;base64,{data}">'
                            f"<figcaption>{e(v[1])}</figcaption></figure>")
            else:
                body.append(_MARKDOWN.render(_block_markdown(kind, v)).rstrip("\n"))
        css = ("body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1200px;margin:2em auto;"
               "padding:0 1em;color:#222;line-height:1.45}"
               # tables fit the page (1,280 px windows and narrower): long option names and plans wrap
               ".tw{max-width:100%;overflow-x:auto}table{border-collapse:collapse;margin:1em 0;font-size:12px}"
               "th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}"
               "td.w{white-space:normal;overflow-wrap:anywhere;min-width:7em;text-align:left}th{background:#f0f0f0;white-space:normal}"
               "td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee}"
               "figure{margin:1.5em 0}figcaption{font-size:12px;color:#666}code{background:#f4f4f4;padding:0 3px}")
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + e(title)
                + f"</title><style>{css}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _block_markdown(kind: str, v: Any) -> str:
    """One block of the report as Markdown (report.md; report.html renders the same text)."""
    if kind == "h":
        return "#" * v[0] + " " + v[1]
    if kind == "ul":
        return "\n".join(f"- {x}" for x in v)
    if kind == "table":
        head, rows = v
        esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
        lines = ["| " + " | ".join(esc(h) for h in head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows])
    if kind == "img":
        return f"![{v[1]}]({v[0]})"
    return str(v)  # a paragraph


LONG_CELL = 16  # characters of a table cell above which it may wrap (option, plan, reasons); numbers stay whole


def _markdown_renderer() -> MarkdownIt:
    """CommonMark with tables, raw HTML off; each table in a horizontally scrolling wrapper
    (`div.tw`) and a long cell marked `td.w` (may wrap)."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")

    def table_open(self: Any, tokens: Sequence[Token], idx: int, options: Any, env: Any) -> str:
        return '<div class="tw">' + str(self.renderToken(tokens, idx, options, env))

    def table_close(self: Any, tokens: Sequence[Token], idx: int, options: Any, env: Any) -> str:
        return str(self.renderToken(tokens, idx, options, env)).rstrip("\n") + "</div>\n"

    def td_open(self: Any, tokens: Sequence[Token], idx: int, options: Any, env: Any) -> str:
        if len(tokens[idx + 1].content) > LONG_CELL:
            tokens[idx].attrSet("class", "w")
        return str(self.renderToken(tokens, idx, options, env))

    md.add_render_rule("table_open", table_open)
    md.add_render_rule("table_close", table_close)
    md.add_render_rule("td_open", td_open)
    return md


_MARKDOWN = _markdown_renderer()


def _summary_rows(rows: list[dict], limit: int = 40) -> list[dict]:
    feas = [r for r in rows if r.get("feasible")]
    if len(feas) <= limit:
        keep = feas
    else:
        keep = sorted(feas, key=lambda r: (not r.get("recommended"), not r.get("pareto"),
                                           not r.get("meets_constraints"), r["time_to_train_days"]))[:limit]
    return sorted(keep, key=lambda r: (r["time_to_train_days"], r["cost_usd"], r["option"]))


def write_report(doc: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write report.md, report.html and the PNG plots for a results.json document; return the paths.
    matplotlib's layout warnings (a crowded figure) are not printed: the plots are written as they are."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _write_report(doc, out_dir)


def _fleet_section(d: "_Doc", fleet: dict[str, Any]) -> None:
    """The fleet: its pools, each scenario's assignment of jobs to pools, and what to buy next."""
    d.h(2, "Fleet: which pool runs each job, and what to buy next")
    rec = fleet["recommendation"]
    d.p(f"**{rec['reason']}** (objective: minimize {fleet['objective']}).")
    d.table(["pool", "hardware", "owned", "capex", "power"],
            [[p["name"], f"{p['gpu']} x{p['num_gpus']} ({p['topology']})", "yes" if p["owned"] else "candidate",
              money(p["capex_usd"]) if p["capex_usd"] else "-", power(p["power_mw"]) if p["power_mw"] else "-"]
             for p in fleet["pools"]])
    d.p("Each job runs on one pool; a pool runs its jobs one after another; the makespan is the busiest "
        "pool's time. Running cost: energy + amortized capex for the time used; capex: the pools bought.")
    rows = []
    for s in fleet["scenarios"]:
        if not s.get("feasible"):
            rows.append([s["scenario"], "-", "-", "-", "-", "-", s.get("reason", ""), ""])
            continue
        where = "; ".join(f"{j['job']} -> {j['pool']} ({j['time_to_train_days']:.1f} d"
                          + (f", 80%: {j['time_to_train_days_low']:.1f}-{j['time_to_train_days_high']:.1f}"
                             if j.get("time_to_train_days_low") is not None else "") + ")" for j in s["jobs"])
        rows.append([s["scenario"], f"{s['makespan_days']:.1f}", span_days(s, "makespan_days"),
                     money(s["running_cost_usd"]),
                     money(s["capex_usd"]) if s["capex_usd"] else "-", f"{s['energy_mwh']:,.0f}", where,
                     "yes" if not s["violations"] else "; ".join(s["violations"])])
    d.table(["scenario", "makespan days", "80% interval", "running cost", "capex", "MWh", "jobs -> pool", "meets"],
            rows)
    d.p("80% interval: every job's time at the same end of its plan's 80% step-time interval (from the cost "
        "model's validation residuals in the plan's regime).")


def _write_report(doc: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    out = Path(out_dir)
    rows_all: list[dict] = doc["rows"]
    d = _Doc()
    title = f"What-if study: {doc['study']}"
    d.h(1, title)
    if doc.get("description"):
        d.p(doc["description"].strip())
    if not doc.get("complete", True):
        d.p("**Incomplete run**: only the options that finished are shown.")
    _recommendation_section(d, doc)

    gpu_order: list[str] = []
    for r in rows_all:
        if r["gpu"] not in gpu_order:
            gpu_order.append(r["gpu"])
    files: list[Path] = []
    images: list[tuple[str, bytes]] = []
    cons = doc.get("constraints", {})
    done_groups: set[str] = set()
    for wi, w in enumerate(doc["workloads"]):
        _workload_section(d, doc, wi, w, [r for r in rows_all if r["workload"] == w["name"]], gpu_order, cons,
                          done_groups, images)
    d.h(2, "Files")
    d.p("`results.json` (every row, the Pareto fronts, the recommendation), `results.csv` (one row per option and "
        "workload), and the PNG plots next to this report.")
    for name, png in images:
        atomic_write(out / name, png)
        files.append(out / name)
    atomic_write(out / "report.md", d.markdown())
    atomic_write(out / "report.html", d.html(title))
    return files + [out / "report.md", out / "report.html"]


def _recommendation_section(d: _Doc, doc: dict[str, Any]) -> None:
    """The recommendation per scope (and under the other power figures), how it was decided, the
    fleet, the warnings and the assumptions."""
    d.h(2, "Recommendation")
    recs = doc.get("recommendations") or []
    for rec in recs:
        head = f"**{rec['option']}**" if rec.get("option") else "**none**"
        d.p(f"{rec['scope']}: {head} (objective: minimize {rec['objective']}; {rec['candidates']} options with a "
            f"feasible plan, {rec['meeting_constraints']} meet the constraints). Reason: {rec['reason']}.")
        for f, alt in (rec.get("under_other_power_figures") or {}).items():
            used = rec.get("power_figure", "catalog")
            what = (f"**{alt['option']}** ({alt['time_to_train_days']:.1f} days, {money(alt['cost_usd'])}, "
                    f"{power(alt['power_mw'])} by that figure)" if alt.get("option") else "**none**")
            if alt.get("option") == rec.get("option"):
                why = " (the same)."
            else:
                there = [r for r in doc["rows"] if r["option"] == alt.get("option") and r["workload"] in rec["workloads"]]
                broken = sorted({v for r in there for v in r.get("violations") or []})
                why = (f"; by `{used}` that option breaks: {'; '.join(broken)}." if broken else
                       f"; by `{used}` another option is faster or cheaper.")
            d.p(f"Power figure: this study uses `{used}`; under `{f}` the answer would be {what}{why}")
    d.p("Decision made with OR-Tools CP-SAT over the options' solved plans (one boolean per option, exactly one "
        "chosen, budget / capex / power / deadline as linear constraints on values in cents, watts and seconds); "
        "one hardware purchase per option (a mix of GPU types is a `fleet:` of pools).")
    if fleet := doc.get("fleet"):
        _fleet_section(d, fleet)
    if doc.get("warnings"):
        d.h(2, "Warnings")
        d.ul(doc["warnings"])
    d.h(2, "Assumptions")
    d.ul(doc.get("assumptions", []))


def _workload_section(d: _Doc, doc: dict[str, Any], wi: int, w: dict[str, Any], rows: list[dict[str, Any]],
                      gpu_order: list[str], cons: dict[str, Any], done_groups: set[str],
                      images: list[tuple[str, bytes]]) -> None:
    """One workload: its options' summary table and plots, goodput, where the step time goes (once per
    model and training), and the options without a feasible plan. Plots are appended to `images`."""
    slug = f"w{wi + 1}"
    with_topo = len({(r["gpu"], r["topology"]) for r in rows}) > len({r["gpu"] for r in rows})
    d.h(2, f"Workload {wi + 1}: {w['name']}")
    t = w["training"]
    d.p(f"Model `{w['model']}`, {fmt_tokens(w['tokens'])} tokens, sequence {t['seq_len']}, global batch "
        f"{t['global_batch_size']} sequences, {t['precision']}.")
    if fb := w.get("flop_budget"):
        d.p(f"FLOP budget: {fb['model_flops']:.3g} model FLOPs ({fb['model_flops_per_token']:.3g} per token: "
            f"{fb['weight_flops_per_token'] / fb['matmul_params']:.0f} N + causal attention, the convention MFU "
            f"counts; the plain {fb['weight_flops_per_token'] / fb['matmul_params']:.0f} N T alone is "
            f"{fb['weight_flops']:.3g}); each option's hardware FLOPs, with its plan's recompute, are in "
            f"results.csv (`hardware_flops`).")
    feas = [r for r in rows if r.get("feasible")]
    infeasible = [r for r in rows if not r.get("feasible")]
    if feas:
        fastest = min(feas, key=lambda r: r["time_to_train_days"])
        cheapest = min(feas, key=lambda r: r["cost_usd"])
        d.ul([f"fastest: {fastest['option']}, {fastest['time_to_train_days']:.1f} days, "
              f"{money(fastest['cost_usd'])}",
              f"cheapest: {cheapest['option']}, {cheapest['time_to_train_days']:.1f} days, "
              f"{money(cheapest['cost_usd'])}",
              f"Pareto front (time vs cost): {', '.join(doc['pareto'].get(w['name'], [])) or '-'}"])
        name = f"time_vs_cost_{slug}.png"
        png = plot_time_cost(rows, gpu_order, cons, f"{w['name']}: time vs cost")
        images.append((name, png))
        d.img(name, f"{w['name']}: time to train vs cost, Pareto front and constraints", png)
        d.p("`*` marks the recommended option. Pareto: on the front of time vs cost among the options that "
            "meet every constraint (budget, capex, power cap, deadline); meets: yes, or what the option breaks. "
            "80%: the plan's 80% step-time interval (from the cost model's validation residuals in the plan's "
            "regime) carried to the time to train and the time-proportional cost (cloud hours, energy, "
            "amortized capex; the capex itself is fixed); options whose intervals overlap are not told apart "
            "by the model.")
        d.table(["option", "plan", "step s", "tokens/s", "MFU", "goodput", "days", "days 80%", "cost", "cost 80%",
                 "capex", "MWh", "power", "tokens/$", "Pareto", "meets"],
                [[("* " if r.get("recommended") else "") + r["option"], r.get("plan_short", ""),
                  f"{r['step_time_s']:.3g}", num(r["tokens_per_s"]), pct(r["mfu"]), pct(r["goodput"]),
                  f"{r['time_to_train_days']:.1f}", span_days(r, "time_to_train_days"), money(r["cost_usd"]),
                  span_money(r, "cost_usd"), money(r["capex_usd"]) if r["capex_usd"]
                  else "-", f"{r['energy_mwh']:,.0f}" if r["energy_mwh"] >= 10 else f"{r['energy_mwh']:.2g}",
                  power(r["power_mw"]), num(r.get("tokens_per_usd")), "yes" if r.get("pareto") else "",
                  "yes" if r.get("meets_constraints") else "; ".join(r.get("violations", []))]
                 for r in _summary_rows(rows)])
        name = f"cost_energy_{slug}.png"
        png = plot_cost_energy(rows, f"{w['name']}: cost and energy to train", with_topo)
        images.append((name, png))
        d.img(name, f"{w['name']}: cost and energy breakdown", png)
        d.h(3, "Goodput")
        d.p("Goodput: the share of wall time spent on useful training (failures, checkpoints, restarts, spot "
            "preemptions, other losses). Efficiency: useful tokens per second over the "
            "cluster's theoretical maximum at peak FLOP/s, i.e. MFU x goodput.")
        gp_rows = sorted({(r["num_gpus"], r["gpu"], r["topology"], r["mode"] == "spot"): r for r in feas}.values(),
                         key=lambda r: (r["num_gpus"], r["gpu"], r["topology"], r["mode"]))
        spot = any(r["mode"] == "spot" for r in gp_rows)
        d.table(["hardware", "cluster MTBF h", "checkpoint GB", "write s", "interval (Young/Daly) s", "restart s",
                 "goodput", "efficiency"],
                [[label(r, with_topo, with_mode=spot), fixed(r["mtbf_h"], ".3g"), fixed(r["checkpoint_gb"], ",.0f"),
                  fixed(r["checkpoint_s"], ".3g"), fixed(r["checkpoint_interval_s"], ",.0f"), fixed(r["restart_s"], ".0f"),
                  pct(r["goodput"]), pct(r.get("goodput_efficiency"))] for r in gp_rows[:60]])
        group = dumps_json([w["model"], w["training"]])
        if group not in done_groups:
            done_groups.add(group)
            _hardware_section(d, w, rows, feas, slug, with_topo, gpu_order, images)
    if infeasible:
        d.h(3, "Options without a feasible plan")
        d.table(["option", "reason"], [[r["option"], r.get("reason", "")] for r in infeasible[:60]])


def _hardware_section(d: _Doc, w: dict[str, Any], rows: list[dict[str, Any]], feas: list[dict[str, Any]], slug: str,
                      with_topo: bool, gpu_order: list[str], images: list[tuple[str, bytes]]) -> None:
    """Where the step time goes, what faster hardware would buy (the binding resource), and scaling."""
    d.h(3, "Where the step time goes, and what faster hardware would buy")
    name = f"step_breakdown_{slug}.png"
    png = plot_step_breakdown(rows, f"{w['model']}: step-time breakdown", with_topo, gpu_order)
    images.append((name, png))
    d.img(name, f"{w['model']}: share of the step time per category", png)
    name = f"sensitivity_{slug}.png"
    png = plot_sensitivity(rows, f"{w['model']}: step-time gain from faster hardware", with_topo,
                           gpu_order)
    images.append((name, png))
    d.img(name, f"{w['model']}: step-time reduction with 2x inter-node bandwidth, 2x NVLink, "
                "the larger-HBM sibling GPU, fp8", png)
    d.p(f"Binding: the resource whose relaxation cuts the step time the most, named only when that cut "
        f"is at least {BINDING_MIN_GAIN_PCT:g}% (else none): twice a resource's speed is estimated "
        "to save half its share of the step (each share measured by slowing that resource 1.25x); "
        "HBM capacity counts for a plan filling >= 90% of its memory, as the plan re-solved on the "
        "larger-HBM sibling minus what the same plan gains there from faster HBM alone.")
    d.table(["hardware", "binding", "2x inter-node", "2x NVLink", "+HBM", "fp8", "notes"],
            [[label(r, with_topo, with_mode=False), r.get("binding") or "-",
              *[gain(r.get(k)) for k, _ in GAINS],
              "; ".join(r.get("sensitivity_notes") or [])
              + (f" (+HBM = {r['hbm_plus_gpu']})" if r.get("hbm_plus_gpu") else "")]
             for r in sorted(_hardware_rows(rows), key=lambda r: (
                 gpu_order.index(r["gpu"]), r["topology"], r["num_gpus"]))][:60])
    if len({r["num_gpus"] for r in feas}) > 1:
        name = f"scaling_{slug}.png"
        png = plot_scaling(rows, f"{w['model']}: scaling with the GPU count", gpu_order)
        images.append((name, png))
        d.img(name, f"{w['model']}: tokens/s, MFU and goodput vs GPU count", png)


