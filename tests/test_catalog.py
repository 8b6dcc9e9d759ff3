"""The catalog against published figures: GPUs (GB vs GiB, usable HBM, peaks per precision), which GPU
runs which precision recipe, the recipes' memory and HBM costs, topology presets and level-size rules."""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard import Plan, evaluate, load_problem
from autoshard.catalog import (_recipes, gemm_flops_per_s, gemm_peak_flops_per_s, get_gpu,
                               get_recipe, get_topology, gpu_ids, low_precision_fraction, precision_id,
                               precision_ids, quant_overhead_bytes_per_element, supports, topology_ids,
                               weight_copy_bytes_per_param)
from autoshard.errors import InputError
from autoshard.spec import ClusterSpec, Precision, TopologyLevel
from autoshard.topology import all_reduce_s, all_to_all_s, cluster_graph, contiguous_profile, level_size_error, \
    resolve_levels, segmented_sizes

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


# ---- GPUs: every figure sourced, GB vs GiB ---------------------------------------------------------


@pytest.mark.parametrize("gid", gpu_ids())
def test_every_gpu_figure_has_a_source(gid):
    g = get_gpu(gid)
    for key in ("peak_tflops", "hbm_usable_gib", "hbm", "scaleup_gb_per_s", "tdp_w", "price", "efficiency"):
        assert g.sources.get(key, "").strip(), f"{gid}: no source for {key}"
    if g.host_memory_gb is not None:
        assert g.host_link_gb_per_s and g.sources.get("host_memory"), gid
    assert g.default_topology in topology_ids()
    assert g.precisions and all(precision_id(p) for p in g.precisions), gid


@pytest.mark.parametrize("gid", gpu_ids())
def test_usable_hbm_is_in_gib_and_below_the_vendor_figure(gid):
    # HBM stacks are binary (an "80 GB" H100 has 80 GiB of HBM3); the driver exposes a little less
    # (ECC, its reserve). So usable GiB <= vendor figure, and within a few percent of it ...
    g = get_gpu(gid)
    assert 0.9 * g.hbm_gb <= g.hbm_usable_gib <= g.hbm_gb
    # ... and bytes are GiB x 2**30, never GB x 1e9.
    assert g.hbm_bytes == g.hbm_usable_gib * GIB
    assert g.hbm_vendor_bytes == g.hbm_gb * 1e9


def test_usable_hbm_matches_published_figures():
    # seed002: B200 "192 GB (180 usable)"; nvidia-smi totals: H100 81,559 MiB, H200 143,771 MiB.
    assert get_gpu("b200").hbm_gb == 192 and get_gpu("b200").hbm_usable_gib == pytest.approx(180, abs=1)
    assert get_gpu("h100").hbm_usable_gib == pytest.approx(81559 / 1024, abs=0.01)
    assert get_gpu("h200").hbm_usable_gib == pytest.approx(143771 / 1024, abs=0.01)
    # The old catalog held GB figures in a GiB field: B200 "180 GiB" is 193 GB, above the seeds' 180.
    assert get_gpu("b200").hbm_bytes / 1e9 == pytest.approx(192.3, abs=0.1)
    # seed002 / REF §2: Blackwell Ultra 288 GB; GB200 NVL72 13.4-13.8 TB HBM per 72 GPUs; MI3xx.
    for gid in ("b300", "gb300"):
        assert get_gpu(gid).hbm_gb == 288
    assert 13.3e12 <= 72 * get_gpu("gb200").hbm_vendor_bytes <= 13.9e12
    assert (get_gpu("mi300x").hbm_gb, get_gpu("mi325x").hbm_gb, get_gpu("mi355x").hbm_gb) == (192, 256, 288)


def test_peaks_per_precision_match_published_figures():
    # REF §2 / seed001 (dense): H100 989 / 1,979; B200 2,250 / 4,500 / fp4 9,000; B100 fp4 7,000.
    h = get_gpu("h100-sxm").peak_tflops
    assert (h["bf16"], h["fp8"]) == (989, 1979) and "fp4" not in h
    b = get_gpu("b200").peak_tflops
    assert (b["bf16"], b["fp8"], b["fp4"]) == (2250, 4500, 9000)
    assert get_gpu("b100").peak_tflops["fp4"] == 7000
    assert get_gpu("b100").peak_tflops["bf16"] == pytest.approx(1800, rel=0.03)  # REF rounds to 1,800
    # Rack figures: GB200 NVL72 720 PF fp8 with sparsity; GB300 NVL72 1.1 EF dense fp4, 360 PF dense fp8.
    assert 72 * 2 * get_gpu("gb200").peak_tflops["fp8"] == pytest.approx(720e3)
    assert 72 * get_gpu("gb300").peak_tflops["fp4"] == pytest.approx(1.08e6)
    assert 72 * get_gpu("gb300").peak_tflops["fp8"] == pytest.approx(360e3)
    # AMD: MI300X/MI325X share CDNA3 (1,307 bf16); MI355X 2.5 PF bf16, 10 PF MXFP4.
    assert get_gpu("mi325x").peak_tflops["bf16"] == pytest.approx(get_gpu("mi300x").peak_tflops["bf16"], rel=1e-3)
    assert get_gpu("mi355x").peak_tflops["fp4"] == pytest.approx(10_000, rel=0.01)


@pytest.mark.parametrize("gid", gpu_ids())
def test_fp8_is_twice_16_bit_wherever_it_exists(gid):
    # Every tensor-core generation with fp8 (Ada, Hopper, Blackwell, CDNA3/4) doubles the 16-bit rate.
    p = get_gpu(gid).peak_tflops
    if "fp8" in p:
        assert p["fp8"] == pytest.approx(2 * p.get("bf16", p.get("fp16")), rel=0.01)
    assert "fp4" not in p or p["fp4"] >= 2 * p["fp8"] * 0.99


def test_grace_superchips_reach_host_memory_over_c2c():
    # NVIDIA GH200 datasheet: 480 GB LPDDR5X, NVLink-C2C 900 GB/s bidirectional = 450 each way.
    gh = get_gpu("gh200")
    assert (gh.host_memory_gb, gh.host_link_gb_per_s) == (480, 450)
    assert get_gpu("gb200").host_memory_gb and get_gpu("gb300").host_memory_gb
    assert get_gpu("h100").host_memory_gb is None


def test_meta_grand_teton_h100_is_its_own_part():
    # torchtitan's runs: H100 with 96 GB HBM2e at 2.4 TB/s, 500 W power limit, 400 Gb/s RDMA per GPU.
    g = get_gpu("h100-hbm2e-96gb")
    assert (g.hbm_gb, g.hbm_tb_per_s, g.tdp_w) == (96, 2.4, 500)
    assert get_topology(g.default_topology).levels[-1].bandwidth_gb_per_s == 400 / 8


@pytest.mark.parametrize("name, gid", [
    ("DGX-H100", "h100-sxm"), ("H100-SXM5-80GB", "h100-sxm"), ("DGX-B200", "b200"), ("B200", "b200"),
    ("DGX-GB200", "gb200"), ("GB200", "gb200"), ("DGX-GB300", "gb300"), ("GB300", "gb300"),
    ("DGX-B300", "b300"), ("MI300", "mi300x"), ("MI300X", "mi300x"), ("MI325X", "mi325x"), ("MI355", "mi355x"),
    ("GH200", "gh200"), ("B100", "b100"), ("H100 (96GB HBM2e, 500W power limit)", "h100-hbm2e-96gb")])
def test_validation_row_names_resolve(name, gid):
    # The `gpu` names of shared/validation/modern_runs_dev.json that name one GPU unambiguously.
    assert get_gpu(name).id == gid


# ---- precisions ------------------------------------------------------------------------------------


def test_spec_precisions_are_the_data_files():
    assert set(Precision.__args__) == set(precision_ids())


@pytest.mark.parametrize("name, rid", [
    ("BF16", "bf16"), ("FP8", "fp8-delayed"), ("fp8", "fp8-delayed"), ("FP8-CS", "fp8-current"),
    ("tensorwise", "fp8-current"), ("FP8-MX", "mxfp8"), ("MXFP8", "mxfp8"), ("NVFP4", "nvfp4"),
    ("blockwise", "fp8-blockwise"), ("fp16", "fp16")])
def test_precision_names_of_published_runs(name, rid):
    assert precision_id(name) == rid


@pytest.mark.parametrize("gpu, precision", [
    ("a100", "fp8"), ("a100-sxm-40gb", "fp8-current"), ("v100", "bf16"), ("h100", "mxfp8"), ("h100", "nvfp4"),
    ("mi300x", "mxfp8"), ("mi355x", "nvfp4"), ("rtx-4090", "nvfp4")])
def test_precisions_a_gpu_lacks_are_bad_input(gpu, precision):
    # Issue 15 defect 6: fp8 on A100 (no fp8 tensor cores) and bf16 on V100 were priced silently.
    doc = {"model": "llama3-8b", "training": {"seq_len": 1024, "global_batch_size": 8, "precision": precision},
           "cluster": {"gpu": gpu, "num_gpus": 8}}
    with pytest.raises(InputError) as exc:
        load_problem(doc)
    assert exc.value.field == "training.precision" and "cannot train in" in str(exc.value)


@pytest.mark.parametrize("gpu, precision", [
    ("b200", "nvfp4"), ("gb300", "mxfp8"), ("h100", "fp8-blockwise"), ("mi355x", "mxfp8"), ("mi325x", "fp8"),
    ("v100", "fp16"), ("rtx-4090", "fp8-current")])
def test_precisions_a_gpu_runs_load(gpu, precision):
    p = load_problem({"model": "llama3-8b", "training": {"seq_len": 1024, "global_batch_size": 8,
                                                         "precision": precision},
                      "cluster": {"gpu": gpu, "num_gpus": 8}})
    assert supports(get_gpu(gpu), p.training.precision)


def test_v100_without_a_precision_trains_in_fp16():
    p = load_problem({"model": "llama3-8b", "training": {"seq_len": 1024, "global_batch_size": 8},
                      "cluster": {"gpu": "v100", "num_gpus": 8}})
    assert p.training.precision == "fp16"
    assert gemm_peak_flops_per_s(get_gpu("v100"), "fp16") == 125e12


def test_fp8_on_a100_from_the_cli_is_one_line_exit_2(tmp_path):
    prob = tmp_path / "p.yaml"
    prob.write_text("model: llama3-8b\ntraining: {seq_len: 1024, global_batch_size: 8, precision: fp8}\n"
                    "cluster: {gpu: a100, num_gpus: 8}\n")
    out = tmp_path / "s.json"
    proc = subprocess.run([sys.executable, "-m", "autoshard.cli", "solve", str(prob), "-o", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "training.precision" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_recipe_gemm_rates(monkeypatch):
    h, b = get_gpu("h100"), get_gpu("b200")
    # `fp8` is the frameworks' default recipe, delayed scaling (Megatron --fp8-recipe default).
    assert gemm_flops_per_s(h, "fp8") == gemm_flops_per_s(h, "fp8-delayed")
    # Per-tensor current scaling runs the same GEMM; MXFP8's block scales are applied by Blackwell's
    # tensor cores at the fp8 rate; blockwise scaling on Hopper promotes on CUDA cores (slower).
    assert gemm_flops_per_s(b, "mxfp8") == gemm_flops_per_s(b, "fp8-current") == gemm_flops_per_s(b, "fp8")
    assert gemm_flops_per_s(h, "fp8-blockwise") < gemm_flops_per_s(h, "fp8")
    # FP8 GEMMs: between 1x and 2x the bf16 rate (2x peak, less of it reached).
    assert 1.0 < gemm_flops_per_s(h, "fp8") / gemm_flops_per_s(h, "bf16") <= 2.0
    # NVFP4 as Megatron runs it (first_last_layers_bf16 off): every layer's GEMMs in FP4, at the GPU's
    # fp4 efficiency: B200's sourced fp8 MAMF fraction (3,432.5 / 4,500 = 0.763, no fp4 MAMF published) x the
    # fitted fp4 end-to-end factor (matmul.yaml 0.535): faster than fp8, short of the 2x (B200) or 3x (GB300)
    # peak ratio.
    lo = gemm_flops_per_s(b, "nvfp4")
    assert lo == pytest.approx(9000e12 * b.matmul_efficiency("fp4"))
    assert b.matmul_efficiency("fp4") == pytest.approx(0.763 * 0.535, abs=1e-6)
    assert gemm_flops_per_s(b, "fp8") < lo < 2 * gemm_flops_per_s(b, "fp8")
    g3 = get_gpu("gb300")
    assert 1.5 < gemm_flops_per_s(g3, "nvfp4") / gemm_flops_per_s(g3, "mxfp8") < 3.0
    assert low_precision_fraction("nvfp4") == 1.0 and low_precision_fraction("bf16") == 0
    # A recipe keeping a share of its layers in bf16 (NVIDIA's accuracy recipe keeps 16%, opt-in)
    # gets the FLOP-weighted harmonic mean of the two rates.
    from autoshard import catalog

    kept = catalog.get_recipe("nvfp4").model_copy(update={"bf16_layer_fraction": 0.16})
    monkeypatch.setattr(catalog, "get_recipe", lambda name: kept)
    hi = b.peak_flops("bf16") * b.matmul_efficiency("bf16")
    assert gemm_flops_per_s(b, "nvfp4") == pytest.approx(1 / (0.16 / hi + 0.84 / lo))
    monkeypatch.undo()
    # MFU's denominator is the recipe's data type peak.
    assert gemm_peak_flops_per_s(b, "nvfp4") == 9000e12 and gemm_peak_flops_per_s(h, "fp8-current") == 1979e12


def test_recipe_memory_and_quantization_costs():
    h, b = get_gpu("h100"), get_gpu("b200")
    assert weight_copy_bytes_per_param("bf16", h) == 0 and quant_overhead_bytes_per_element("bf16", h) == 0
    # Hopper's FP8 GEMMs are TN-only: the transposed FP8 weight is cached too; Blackwell's are not.
    assert weight_copy_bytes_per_param("fp8", h) == 2 and weight_copy_bytes_per_param("fp8", b) == 1
    # OCP MX: one 8-bit scale per 32 elements, rowwise and columnwise copies.
    assert weight_copy_bytes_per_param("mxfp8", b) == pytest.approx(2 * (1 + 1 / 32))
    # NVFP4: 4-bit values with one E4M3 scale per 16, both directions, on every layer.
    assert weight_copy_bytes_per_param("nvfp4", b) == pytest.approx(2 * (0.5 + 1 / 16))
    # Current scaling reads the bf16 tensor once more for its amax than delayed scaling: +2 B/element.
    for g in (h, b):
        assert quant_overhead_bytes_per_element("fp8-current", g) - quant_overhead_bytes_per_element("fp8", g) == 2
    # One read of bf16 (2 B) is the floor of every quantizing recipe.
    for rid in ("fp8-delayed", "fp8-current", "fp8-blockwise", "mxfp8", "nvfp4"):
        assert quant_overhead_bytes_per_element(rid, b) > 2
        assert get_recipe(rid).sources.get("recipe")


def test_fp8_keeps_more_weight_memory_on_hopper_in_the_cost_model():
    # The cost model's static memory calls the catalog: H100 fp8 adds 2 B/param to the bf16 weights.
    doc = {"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch_size": 8},
           "cluster": {"gpu": "h100", "num_gpus": 8}}
    plan = Plan(tp=8, zero_stage=1)
    bf16 = evaluate(load_problem(doc), plan)
    doc["training"]["precision"] = "fp8"
    fp8 = evaluate(load_problem(doc), plan)
    w_bf16, w_fp8 = bf16.memory_breakdown_gib["weights"], fp8.memory_breakdown_gib["weights"]
    assert w_fp8 == pytest.approx(w_bf16 * 2, rel=1e-9)  # 2 B bf16 + 2 B fp8 copies = 2x
    # 2,048 tokens per layer over TP 8 leave each layer's kernels shorter than its eager launches
    # (cost.layers._eager_host): FP8's faster GEMMs show where CUDA graphs take the host away
    graphs = plan.model_copy(update={"cuda_graphs": True})
    assert evaluate(load_problem(doc), graphs).step_time_s < evaluate(load_problem({**doc, "training": {
        "seq_len": 2048, "global_batch_size": 8}}), graphs).step_time_s


# ---- topologies --------------------------------------------------------------------------------------


@pytest.mark.parametrize("tid", topology_ids())
def test_presets_follow_the_level_size_rule_and_are_sourced(tid):
    t = get_topology(tid)
    assert level_size_error([lv.size for lv in t.levels]) is None
    assert t.source.strip()


def test_top_level_need_not_divide_for_users_as_for_presets():
    # GB200: 576-GPU leaves under a 16,384-GPU spine (16,384 / 576 is not whole), preset and user alike.
    gb = get_topology("gb200-nvl72").levels
    assert gb[-1].size % gb[-2].size
    levels = [lv.model_dump() for lv in gb]
    p = load_problem({"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch_size": 1152},
                      "cluster": {"gpu": "gb200", "num_gpus": 1152, "topology": levels}})
    assert evaluate(p, Plan(tp=1, zero_stage=1)).step_time_s > 0
    # A level below the top must still divide the next one.
    bad = [dict(levels[0]), {**levels[1], "size": 100}, dict(levels[2])]
    with pytest.raises(InputError) as exc:
        load_problem({"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch_size": 8},
                      "cluster": {"gpu": "gb200", "num_gpus": 1152, "topology": bad}})
    assert exc.value.field == "cluster.topology.1.size"
    assert level_size_error([8, 6]) == (1, "level sizes must grow (8 -> 6)")


def test_nvl576_is_one_full_bandwidth_domain_of_576():
    # seed001: NVL576 makes 576 GPUs one full-bandwidth domain through two switch layers. An all-to-all
    # over 576 GPUs (expert parallelism) then sends the 7/8 of its bytes bound for other racks at
    # 900 GB/s; between NVL72 racks they leave at 50 GB/s (REFERENCE §3: 3.6 TB/s per rack of 72).
    def a2a(topo):
        cl = ClusterSpec(gpu="gb200", num_gpus=576, topology=topo)
        lv = tuple(lvl.__class__(**{**lvl.__dict__, "bytes_per_s": lvl.link_bytes_per_s, "latency_s": 0.0})
                   for lvl in resolve_levels(cl, get_gpu("gb200")))
        return all_to_all_s(lv, contiguous_profile(cluster_graph(lv, 576), 576), 1e9)
    assert a2a("nvl576") == pytest.approx(1e9 * (1 - 72 / 576) / 900e9)
    assert a2a("gb200-nvl72") == pytest.approx(1e9 * (1 - 72 / 576) / 50e9)


def test_nvl72_jobs_run_in_equal_segments_of_trays_as_slurm_segment_places_them():
    # Megatron-Bridge's launcher (scripts/performance/utils/executors.py, 25.09 to v0.6.0) asks Slurm for
    # `--segment` = the largest node count <= 18 that divides the job's nodes, on 4-GPU GB200 / GB300
    # compute trays (18 per NVL72 rack). Brute force of that rule against the levels the job is priced on.
    for gpu, topo in (("gb200", "gb200-nvl72"), ("gb300", "gb300-nvl72")):
        for nodes in range(19, 400):
            segment = next(s for s in range(18, 0, -1) if nodes % s == 0)
            levels = resolve_levels(ClusterSpec(gpu=gpu, num_gpus=4 * nodes, topology=topo), get_gpu(gpu))
            assert levels[0].size == 4 * segment, (topo, nodes)
            if len(levels) > 2:  # a leaf of 8 racks holds 8 segments
                assert levels[1].size == 8 * 4 * segment
        for n in (8, 64, 72):  # one rack: the job's GPUs share one NVLink domain, as before
            assert resolve_levels(ClusterSpec(gpu=gpu, num_gpus=n, topology=topo), get_gpu(gpu))[0].size == 72
    # 256 GB200 = 4 racks x 64: an all-to-all over 32 consecutive ranks (EP32) stays on NVLink,
    # 1e9 B x 31/32 at 900 GB/s; packed 72 to a rack, ranks 64-95 straddle two racks and the worst
    # group sends 1e9 x (1 - 16/32) at 50 GB/s.
    def a2a(levels_spec, n=256, group=32):
        cl = ClusterSpec(gpu="gb200", num_gpus=n, topology=levels_spec)
        lv = tuple(lvl.__class__(**{**lvl.__dict__, "bytes_per_s": lvl.link_bytes_per_s, "latency_s": 0.0})
                   for lvl in resolve_levels(cl, get_gpu("gb200")))
        return all_to_all_s(lv, contiguous_profile(cluster_graph(lv, n), group), 1e9)
    assert a2a("gb200-nvl72") == pytest.approx(1e9 * 31 / 32 / 900e9)
    packed = [lv.model_copy(update={"segment_unit_gpus": None}) for lv in get_topology("gb200-nvl72").levels]
    assert a2a(packed) == pytest.approx(1e9 * (1 - 16 / 32) / 50e9)
    # a job that is no multiple of the tray, and 1,152 GPUs (16 full racks), keep the racks whole
    assert segmented_sizes([72, 576, 16384], [4, None, None], 258) == [72, 576, 16384]
    assert segmented_sizes([72, 576, 16384], [4, None, None], 1152) == [72, 576, 16384]
    assert segmented_sizes([72, 576, 16384], [4, None, None], 2496) == [64, 512, 16384]  # 624 trays: 39 x 16


def test_h800_reduces_in_the_network_and_h100_pcie_is_a_gen5_server():
    # The seeds: Hopper-generation switches bring in-network reduction (H800 too).
    assert all(lv.sharp for lv in get_topology("h800-cluster").levels)
    g = get_gpu("h100-pcie")
    pcie = get_topology(g.default_topology).levels
    # PCIe 5.0 x16: 32 GT/s x 16 lanes x 128/130 / 8 = 63 GB/s each way (not the 4.0 box's 32).
    assert pcie[0].bandwidth_gb_per_s == pytest.approx(32 * 16 * 128 / 130 / 8, rel=0.02)
    assert pcie[0].bandwidth_gb_per_s == g.scaleup_gb_per_s
    assert pcie[1].bandwidth_gb_per_s >= 25  # a 400 Gb/s NIC per 2 GPUs, not 100 GbE per box


def test_ring_vs_in_network_allreduce_is_the_seeds_factor_of_two():
    # seed000: 40-50% efficiency without in-network reduction vs 70-80% with it, i.e. about twice the
    # bandwidth; the idealized formulas (REF §4) give exactly 2 (N-1)/N : 1 on the same links.
    def ar(sharp):
        lv = [TopologyLevel(name="nvlink", size=8, bandwidth_gb_per_s=450, sharp=sharp, latency_us=0, efficiency=1.0)]
        levels = resolve_levels(ClusterSpec(gpu="h100", num_gpus=8, topology=lv), get_gpu("h100"))
        return all_reduce_s(levels, contiguous_profile(cluster_graph(levels, 8), 8), 1e9)
    assert ar(False) / ar(True) == pytest.approx(2 * 7 / 8)
    assert 70 / 50 <= ar(False) / ar(True) <= 80 / 40


def test_old_preset_names_and_aliases_resolve():
    for name, tid in (("dgx-h100-superpod", "dgx-h100-superpod"), ("pcie-box", "pcie-box"), ("NVL576", "gb200-nvl576"),
                      ("selene", "dgx-a100-superpod"), ("nvl72", "gb200-nvl72"), ("h800", "h800-cluster")):
        assert get_topology(name).id == tid
    for f in sorted((ROOT / "problems").glob("*.yaml")):
        load_problem(str(f))  # every bundled problem still loads


def test_every_recipe_is_sourced():
    for rid, r in _recipes()[0].items():
        assert r.sources.get("recipe"), rid
        if r.gemm_dtype not in ("bf16", "fp16"):
            assert r.sources.get("weight_copy") and r.sources.get("quant_overhead"), rid


def test_rowwise_fp8_sits_between_bf16_and_tensorwise_as_torchtitan_measured():
    # torchtitan commit 7a04053, Llama 3 8B on 8 H100 (FSDP, compile): bf16 5,760 tok/s, torchao row-wise
    # 6,424 (1.115x), tensor-wise 7,186 (1.248x). Row-wise keeps no FP8 weight cache (torchao).
    times = {}
    for prec in ("bf16", "fp8-rowwise", "fp8-current"):
        p = load_problem({"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 8, "precision": prec},
                          "cluster": {"gpu": "h100", "num_gpus": 8}})
        times[prec] = evaluate(p, Plan(tp=1, zero_stage=3, recompute="selective")).step_time_s
    assert times["bf16"] > times["fp8-rowwise"] > times["fp8-current"]
    assert 1.05 < times["bf16"] / times["fp8-rowwise"] < 1.25
    assert weight_copy_bytes_per_param("fp8-rowwise", get_gpu("h100")) == 0
    assert not supports(get_gpu("rtx-4090"), "fp8-rowwise")  # torch._scaled_mm row-wise needs sm90+


def test_catalog_command_lists_units_and_precisions():
    proc = subprocess.run([sys.executable, "-m", "autoshard.cli", "catalog", "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    import json  # noqa: PLC0415

    doc = json.loads(proc.stdout)
    b200 = next(g for g in doc["gpus"] if g["id"] == "b200")
    assert (b200["hbm_gb"], b200["hbm_usable_gib"]) == (192, 179.06) and "nvfp4" in b200["precisions"]
    assert {r["id"] for r in doc["precisions"]} == set(precision_ids()) - {"fp8"}
    assert any(t["id"] == "gb200-nvl576" for t in doc["topologies"])


def test_gb200_nvl72_scale_out_is_the_seeds_3_6_tb_per_rack():
    # seed000 / REF §3: a GB200 NVL72 rack's scale-out egress is 4 x 18 x 400 Gb/s / 8 = 3.6 TB/s
    # (4 NICs on each of 18 compute trays, 400 Gb/s each, 8 bits per byte) for 72 GPUs: 50 GB/s per GPU
    # (the preset had 100 GB/s, calling 3.6 TB/s a 4-GPU tray's egress, which does not compute).
    rack_bytes_per_s = 4 * 18 * 400e9 / 8
    assert rack_bytes_per_s == 3.6e12
    for topo in ("gb200-nvl72", "gb200-nvl576"):
        levels = get_topology(topo).levels
        assert levels[0].size == 72 and levels[0].bandwidth_gb_per_s == 900
        beyond = [lv for lv in levels if lv.bandwidth_gb_per_s < 900]
        assert beyond and all(lv.bandwidth_gb_per_s * 1e9 == rack_bytes_per_s / 72 for lv in beyond), topo
    assert "3.6 TB/s per rack of 72 GPUs = 3,600 / 72 = 50 GB/s per GPU" in get_topology("gb200-nvl72").source


# ---- matmul efficiency: sourced achievable-GEMM fraction x clock under the power limit x one fitted factor ----

# Bekman, ml-engineering compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS comparison table'
# (mamf-finder.py): measured TFLOP/s and the dense peak it is divided by, per GPU and data type.
MAMF_TFLOPS = {
    ("a100-sxm-80gb", "bf16"): (271.2, 312), ("a100-sxm-40gb", "bf16"): (271.2, 312),
    ("h100-sxm", "bf16"): (794.5, 989), ("h100-sxm", "fp8"): (1402.6, 1979),
    ("h200-sxm", "bf16"): (794.5, 989), ("h200-sxm", "fp8"): (1453.4, 1979),
    ("gh200", "bf16"): (828.6, 989), ("gh200", "fp8"): (1535.0, 1979),
    ("b200", "bf16"): (1745.0, 2250), ("b200", "fp8"): (3432.5, 4500),
    ("gb200", "bf16"): (1822.0, 2500), ("gb200", "fp8"): (3615.6, 5000),
    ("b300", "bf16"): (1769.0, 2250), ("b300", "fp8"): (3353.3, 4500),
    ("mi300x", "bf16"): (668.4, 1300), ("mi325x", "bf16"): (784.9, 1300), ("mi355x", "bf16"): (1565.0, 2516.6),
}


@pytest.mark.parametrize("key", sorted(MAMF_TFLOPS))
def test_gemm_achievable_is_the_published_mamf(key):
    gid, dtype = key
    mamf, peak = MAMF_TFLOPS[key]
    g = get_gpu(gid)
    assert g.gemm_achievable[dtype] == pytest.approx(mamf / peak, abs=5e-4)
    assert "Maximum Achievable Matmul FLOPS" in g.sources["gemm_achievable"]
    assert f"{mamf:,.1f}" in g.sources["gemm_achievable"]  # the cited figure itself


def test_gb300_gemm_rate_is_derived_from_b300_and_the_gb200_to_b200_ratio():
    # No GB300 MAMF is published: B300's measured rate (1,100 W) stepped to GB300's 1,400 W at the per-watt
    # step the same die measures from B200 (1,000 W) to GB200 (1,200 W), in log power, over GB300's peak.
    g = get_gpu("gb300")
    step = math.log(1400 / 1100) / math.log(1200 / 1000)
    assert step == pytest.approx(1.3227, abs=1e-4)
    assert g.tdp_w == 1400 and get_gpu("b300").tdp_w == 1100 and get_gpu("gb200").tdp_w == 1200
    assert g.gemm_achievable["bf16"] == pytest.approx(1769.0 * (1822.0 / 1745.0) ** step / 2500, abs=5e-4)
    assert g.gemm_achievable["fp8"] == pytest.approx(3353.3 * (3615.6 / 3432.5) ** step / 5000, abs=5e-4)
    # hand-worked: 1,769.0 x 1.0588 / 2,500 = 0.749; 3,353.3 x 1.0712 / 5,000 = 0.718
    assert (g.gemm_achievable["bf16"], g.gemm_achievable["fp8"]) == (0.749, 0.718)


@pytest.mark.parametrize("gid", gpu_ids())
def test_matmul_efficiency_is_sourced_rate_x_clock_x_the_generation_factor(gid):
    import yaml as _yaml
    from importlib import resources

    model = _yaml.safe_load(resources.files("autoshard.data").joinpath("matmul.yaml").read_text())
    g = get_gpu(gid)
    gen = next((k for k, archs in model["generations"].items() if g.arch in archs), None)
    assert g.gemm_achievable and g.sources.get("gemm_achievable")
    for dtype, ach in g.gemm_achievable.items():
        fam = {"fp16": "bf16"}.get(dtype, dtype)
        table = model["end_to_end"][fam]
        e2e = table.get(gen, table.get("all", math.exp(sum(math.log(v) for v in table.values()) / len(table))))
        clock = min(1.0, g.tdp_w / (g.rated_power_w or g.tdp_w)) ** (1 / 3)
        assert g.efficiency.matmul[dtype] == pytest.approx(ach * clock * e2e, rel=1e-5)


def test_power_limit_lowers_the_sustained_clock_by_the_cube_root():
    # torchtitan's H100 96GB runs at a 500 W limit on a 700 W part: (500/700)^(1/3) = 0.8939.
    t = get_gpu("h100-96gb")
    assert t.tdp_w == 500 and t.rated_power_w == 700
    assert t.clock_fraction() == pytest.approx((500 / 700) ** (1 / 3), rel=1e-9) == pytest.approx(0.8939, abs=1e-4)
    # H100 SXM: same die at its own 700 W limit; a cluster cap of 500 W prices it as the capped part.
    h = get_gpu("h100-sxm")
    assert h.clock_fraction() == 1.0 and h.clock_fraction(900) == 1.0  # a cap above the limit changes nothing
    capped = get_gpu("h100-sxm", None, 500)
    for d in ("bf16", "fp8"):
        assert capped.efficiency.matmul[d] == pytest.approx(h.efficiency.matmul[d] * 0.8939, rel=1e-4)
        assert capped.efficiency.matmul[d] == pytest.approx(t.efficiency.matmul[d], rel=1e-5)
    assert get_gpu("h100-sxm", None, 800).efficiency.matmul == h.efficiency.matmul


def test_cluster_power_cap_slows_a_compute_bound_step():
    doc = {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 32},
           "cluster": {"gpu": "h100", "num_gpus": 8}}
    plan = Plan(tp=1, dp=8, zero_stage=1, micro_batch_size=1)
    free = evaluate(load_problem(doc), plan)
    doc["cluster"]["power_cap_w"] = 500
    capped = evaluate(load_problem(doc), plan)
    assert free.step_time_s < capped.step_time_s < free.step_time_s / 0.8939 * 1.0001
    doc["cluster"]["power_cap_w"] = -5
    with pytest.raises(InputError, match="power_cap_w"):
        load_problem(doc)


def test_fitted_matmul_factors_are_few():
    # One end-to-end factor per precision family and GPU generation (7), against 14 per-GPU factors before;
    # with the 5 framework factors, 12 fitted factors in all.
    from autoshard.validate.loso import FACTORS, PER_GPU_FACTORS

    assert len(FACTORS) == 12 and len(PER_GPU_FACTORS) == 19
    assert sum(f.kind == "scaled" for f in FACTORS) == 7 and not any(f.kind == "matmul" for f in FACTORS)
