"""Issue 31, items 1-16: the third round of hostile inputs. Each test runs the failing case of the
issue and asserts the guaranteed behaviour (docs/faults.md): bad input is exit 2 with one line naming
the file and the field path, nothing written; no read blocks or runs unbounded; Ctrl-C is exit 130.

The shared machinery under test: `autoshard.fileio` (one bounded reader, one output-path guard),
`spec.EfficiencyFactor` (one range policy for every efficiency), `solver.search.check_solve_arguments`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from cli_helpers import one_line, run_cli
from autoshard.errors import InputError
from autoshard.fileio import same_file
from autoshard.frameworks import profiles
from autoshard.spec import EFFICIENCY_FLOOR, MAX_GPUS, Plan

ROOT = Path(__file__).resolve().parents[1]
OK = ROOT / "tests" / "data" / "bad" / "ok_problem.yaml"
HF = ROOT / "tests" / "data" / "hf" / "Meta-Llama-3-8B.json"
BIG = ROOT / "tests" / "data" / "hard_proof_moe.yaml"  # an exact proof (--gap 0) takes ~13 s on 2 cores
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

main = run_cli


def cli(*args: str, timeout: float = 60, shell_suffix: str = "") -> subprocess.CompletedProcess:
    """`autoshard ARGS` in a fresh interpreter (for FIFOs, devices, closed descriptors), bounded in time:
    a hang fails the test with TimeoutExpired rather than blocking the suite."""
    cmd = [sys.executable, "-m", "autoshard.cli", *args]
    if shell_suffix:
        return subprocess.run(" ".join(f"'{c}'" for c in cmd) + " " + shell_suffix, shell=True, env=ENV,
                              capture_output=True, text=True, timeout=timeout)
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def prob(tmp_path) -> Path:
    p = tmp_path / "p.yaml"
    shutil.copyfile(OK, p)
    return p


def _runs_json(tmp_path: Path) -> Path:
    from autoshard.validate import default_runs_path  # noqa: PLC0415

    rows = [r for r in json.loads(Path(default_runs_path()).read_text()) if r["id"].startswith("dgxc_v24.11_gpt3")][:4]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(rows))
    return path


# ---- 1-3: the output is never an input ------------------------------------------------------------

def test_solve_output_that_is_the_problem_is_refused(prob, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = prob.read_bytes()
    os.link(prob, tmp_path / "hard.yaml")
    os.symlink(prob, tmp_path / "link.yaml")
    for out in ("p.yaml", "./p.yaml", str(prob), "hard.yaml", "link.yaml"):
        rc, stdout, err = main(capsys, "solve", "p.yaml", "-o", out, "--quiet")
        assert rc == 2 and stdout == "", (out, err)
        assert "--output: is also an input of this command" in one_line(err)
        assert prob.read_bytes() == before  # the problem is intact
    assert same_file(tmp_path / "hard.yaml", prob) and same_file("link.yaml", "./p.yaml")
    # The files the problem names (an --hf-config) are inputs too.
    shutil.copyfile(HF, tmp_path / "config.json")
    cfg = (tmp_path / "config.json").read_bytes()
    rc, _, err = main(capsys, "solve", "p.yaml", "--hf-config", "config.json", "-o", "config.json", "--quiet")
    assert rc == 2 and "is also an input" in one_line(err) and (tmp_path / "config.json").read_bytes() == cfg
    # A name that is no input is written (the guard refuses only what it must).
    rc, _, err = main(capsys, "solve", "p.yaml", "-o", "sol.json", "--quiet")
    assert rc == 0 and json.loads((tmp_path / "sol.json").read_text())["plan"]["tp"] >= 1


def test_solve_output_that_is_the_catalog_it_names_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cat = tmp_path / "cat.yaml"
    cat.write_text(yaml.safe_dump({"gpus": {"h100": {"efficiency": {"matmul": {"bf16": 0.6}, "hbm": 0.8,
                                                                      "scaleup": 0.75, "scaleout": 0.8}}}}))
    doc = yaml.safe_load(OK.read_text())
    doc["cluster"]["catalog"] = "cat.yaml"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    before = cat.read_bytes()
    rc, _, err = main(capsys, "solve", "p.yaml", "-o", "cat.yaml", "--quiet")
    assert rc == 2 and "is also an input" in one_line(err) and cat.read_bytes() == before


def test_calibrate_output_that_is_the_runs_file_is_refused_before_the_fit(tmp_path, capsys, monkeypatch):
    import autoshard.calibrate as cal_mod  # noqa: PLC0415

    monkeypatch.setattr(cal_mod, "_identify", lambda *a, **k: (_ for _ in ()).throw(AssertionError("fitted")))
    runs = _runs_json(tmp_path)
    before = runs.read_bytes()
    rc, out, err = main(capsys, "calibrate", str(runs), "-o", str(runs), "--quiet")
    assert rc == 2 and out == "" and f"{runs}: --output: is also an input" in one_line(err)
    assert runs.read_bytes() == before


def test_export_output_that_is_an_input_is_refused(prob, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, _ = main(capsys, "solve", "p.yaml", "-o", "sol.json", "--quiet", "--top", "0")
    assert rc == 0
    sol, problem = (tmp_path / "sol.json").read_bytes(), prob.read_bytes()
    for out in ("sol.json", "p.yaml"):  # the solution, and the problem file it names
        rc, stdout, err = main(capsys, "export", "sol.json", "--format", "megatron", "-o", out)
        assert rc == 2 and stdout == "" and "--output: is also an input" in one_line(err)
    assert (tmp_path / "sol.json").read_bytes() == sol and prob.read_bytes() == problem
    rc, _, _ = main(capsys, "export", "sol.json", "--format", "megatron", "-o", "run.sh")
    assert rc == 0 and "--tensor-model-parallel-size" in (tmp_path / "run.sh").read_text()


# ---- 4, 5, 10: the bounded reader ------------------------------------------------------------------

@pytest.mark.parametrize("flag", [(), ("--ablations",)], ids=["runs", "ablations"])
def test_validate_refuses_fifo_device_sparse_and_directory_at_once(tmp_path, flag):
    fifo = tmp_path / "runs.json"
    os.mkfifo(fifo)
    sparse = tmp_path / "huge.json"
    with open(sparse, "wb") as fh:
        fh.truncate(20 * 2**30)  # 20 GiB, no blocks
    for path, want in ((fifo, "not a regular file (a FIFO, socket or device)"),
                       ("/dev/zero", "not a regular file (a FIFO, socket or device)"),
                       (sparse, "21,474,836,480 bytes, larger than the 8,388,608 allowed"),
                       (tmp_path, "is a directory")):
        t0 = time.monotonic()
        r = cli("validate", *flag, str(path), timeout=60)
        assert r.returncode == 2 and r.stdout == "", (path, r.stderr)
        assert want in one_line(r.stderr) and str(path) in r.stderr
        assert time.monotonic() - t0 < 30  # refused, not read (a Python start-up is ~2 s)


def test_deeply_nested_json_is_a_clear_error_everywhere(tmp_path, prob, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)  # past Python's recursion limit
    for args in (("validate", str(deep)), ("validate", "--ablations", str(deep)),
                 ("solve", str(prob), "--hf-config", str(deep)), ("calibrate", str(deep), "-o", str(tmp_path / "c.yaml"))):
        rc, out, err = main(capsys, *args)
        assert rc == 2 and out == "" and f"{deep}: nested too deeply (more than 100 levels)" in one_line(err), args
    nested = tmp_path / "cfg.json"  # inside an object: the HF reader's own strict parse
    nested.write_text('{"a": ' + "{\"b\": " * 3000 + "1" + "}" * 3001)
    rc, _, err = main(capsys, "solve", str(prob), "--hf-config", str(nested))
    assert rc == 2 and "nested too deeply" in one_line(err)


def test_batch_skips_a_fifo_named_yaml_without_blocking(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    shutil.copyfile(OK, src / "a.yaml")
    os.mkfifo(src / "f.yaml")
    r = cli("batch", str(src), "-o", str(out), "--quiet", timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"{src / 'f.yaml'}: not a regular file (a FIFO, socket or device), skipped" in r.stdout
    assert (out / "a.json").is_file() and not (out / "f.json").exists()
    # Named on the command line, the FIFO is refused (its record says why), still without blocking.
    r = cli("batch", str(src / "f.yaml"), "-o", str(tmp_path / "out2"), "--quiet", timeout=60)
    assert r.returncode == 2
    rec = json.loads((tmp_path / "out2" / "f.json").read_text())
    assert "not a regular file" in rec["error"]["message"]


# ---- 6, 11: library arguments as strict as the flags -----------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), -1, 0, float("inf"), "5"])
def test_library_solve_refuses_a_time_limit_that_is_not_positive_and_finite(value):
    from autoshard.solver import solve  # noqa: PLC0415

    t0 = time.monotonic()
    with pytest.raises(InputError) as exc:
        solve(OK, time_limit_s=value)
    assert exc.value.field == "time_limit_s" and "must be a number of seconds > 0" in exc.value.message
    assert time.monotonic() - t0 < 5  # refused before any search


@pytest.mark.parametrize("kwargs, field", [({"top_k": -1}, "top_k"), ({"gap_limit": 1.0}, "gap_limit"),
                                           ({"gap_limit": float("nan")}, "gap_limit"),
                                           ({"work_limit": float("inf")}, "work_limit"), ({"jobs": 0}, "jobs")])
def test_library_solve_refuses_other_bad_arguments(kwargs, field):
    from autoshard.solver import solve  # noqa: PLC0415

    with pytest.raises(InputError) as exc:
        solve(OK, **kwargs)
    assert exc.value.field == field


def test_plan_degrees_are_bounded(capsys, prob):
    for knob in ("tp", "pp", "dp", "cp", "ep", "etp"):
        with pytest.raises(ValidationError, match="less than or equal to 1048576"):
            Plan(**{knob: 2**70})
        assert getattr(Plan(**{knob: MAX_GPUS}), knob) == MAX_GPUS  # the bound itself is a plan
    with pytest.raises(ValidationError):
        Plan(vpp=2**70)
    with pytest.raises(ValidationError):
        Plan(micro_batch_size=2**70)
    rc, _, err = main(capsys, "evaluate", str(prob), "--plan", f"tp={2**70}")
    assert rc == 2 and "--plan: tp: Input should be less than or equal to 1048576" in one_line(err)


# ---- 7: SIGINT -------------------------------------------------------------------------------------

@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_sigint_during_solve_stops_it_writes_nothing_and_exits_130(tmp_path, inherited):
    """Ctrl-C during the search; `ignored`: started as a shell script's background job does (SIGINT
    inherited as SIG_IGN), the way `autoshard solve ... & kill -INT $!` runs."""
    out = tmp_path / "out.json"
    handler = signal.SIG_DFL if inherited == "default" else signal.SIG_IGN
    p = subprocess.Popen([sys.executable, "-m", "autoshard.cli", "solve", str(BIG), "-o", str(out), "--quiet",
                          "--gap", "0", "--work-limit", "400", "--time-limit", "120"], env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, handler))
    try:
        time.sleep(4.0)  # past the imports (~1.5 s), inside the search (the full solve takes > 10 s)
        assert p.poll() is None, "the solve ended before it could be interrupted"
        p.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, err = p.communicate(timeout=60)
        stopped_s = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    assert not out.exists() and not list(tmp_path.glob(".out.json.*"))  # nothing partial, no temp file left
    assert stopped_s < 15  # the search stopped, it did not run to its end


# ---- 8, 9: one range policy for every efficiency -----------------------------------------------------

@pytest.mark.parametrize("matmul, hbm, field, want", [
    ({"bf16": ".inf"}, 0.8, "gpus.h100.efficiency.matmul.bf16", "finite number"),
    ({"bf16": 5.0}, 0.8, "gpus.h100.efficiency.matmul.bf16", "less than or equal to 1"),
    ({"bf16": -0.7}, 0.8, "gpus.h100.efficiency.matmul.bf16", "greater than or equal to 0.001"),
    ({"bf16": ".nan"}, 0.8, "gpus.h100.efficiency.matmul.bf16", "finite number"),
    ({}, 0.8, "gpus.h100.efficiency.matmul", "at least 1 item"),
    ({"bf17": 0.5}, 0.8, "gpus.h100.efficiency.matmul.bf17", "'bf16', 'fp16', 'fp8' or 'fp4'"),
    ({"bf16": "1.0e-300"}, 0.8, "gpus.h100.efficiency.matmul.bf16", "greater than or equal to 0.001"),
    ({"bf16": 0.5}, "1.0e-300", "gpus.h100.efficiency.hbm", "greater than or equal to 0.001"),
])
def test_calibrated_catalog_factors_out_of_range_are_bad_input(tmp_path, capsys, matmul, hbm, field, want):
    inner = ", ".join(f"{k}: {v}" for k, v in matmul.items())
    cat = tmp_path / "cat.yaml"
    cat.write_text(f"gpus:\n  h100:\n    efficiency: {{matmul: {{{inner}}}, hbm: {hbm}, scaleup: 0.75, scaleout: 0.8}}\n")
    doc = yaml.safe_load(OK.read_text())
    doc["cluster"]["catalog"] = "cat.yaml"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    rc, out, err = main(capsys, "solve", str(tmp_path / "p.yaml"), "--quiet")
    line = one_line(err)
    assert rc == 2 and out == "" and f"{cat}: {field}: " in line and want in line, line


def test_topology_level_efficiency_out_of_range_is_bad_input(tmp_path, capsys):
    doc = yaml.safe_load(OK.read_text())
    doc["cluster"]["topology"] = [{"name": "node", "size": 8, "bandwidth_gb_per_s": 450, "efficiency": 1e-300}]
    for eff in (1e-300, 0.0, 1.5, float("nan")):
        doc["cluster"]["topology"][0]["efficiency"] = eff
        (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
        rc, _, err = main(capsys, "solve", str(tmp_path / "p.yaml"), "--quiet")
        assert rc == 2 and "p.yaml: cluster.topology.0.efficiency: " in one_line(err), eff


def test_the_efficiency_floor_keeps_the_solver_sane(tmp_path, capsys):
    """Every factor at the floor and the slowest link allowed (0.01 GB/s): a finite plan, exit 0 (the
    floor exists so that the solver's integer times never overflow). The step time is checked against
    the arithmetic: compute alone at 1e-3 of the peak is 1000x slower than at 100%."""
    f = EFFICIENCY_FLOOR
    cat = tmp_path / "cat.yaml"
    cat.write_text(yaml.safe_dump({"gpus": {"h100": {"efficiency": {"matmul": {"bf16": f}, "hbm": f, "scaleup": f,
                                                                      "scaleout": f}}}}))
    doc = yaml.safe_load(OK.read_text())
    doc["cluster"] = {"gpu": "h100", "num_gpus": 16, "catalog": "cat.yaml",
                      "topology": [{"name": "node", "size": 8, "bandwidth_gb_per_s": 0.01, "efficiency": f},
                                   {"name": "net", "size": 16, "bandwidth_gb_per_s": 0.01, "efficiency": f}]}
    doc.pop("search")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    rc, out, err = main(capsys, "solve", str(tmp_path / "p.yaml"), "--json", "--quiet", "--top", "0")
    assert rc == 0, err
    rec = json.loads(out)
    step = rec["estimate"]["step_time_s"]
    # 6 x 8.03e9 parameters x 16 x 2048 tokens / (16 GPUs x 989 TFLOP/s x 1e-3): the model FLOPs alone.
    assert math.isfinite(step) and step > 6 * 8.03e9 * 16 * 2048 / (16 * 989e12 * f)


# ---- 12: closed stdout -------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [("catalog",), ("solve", str(OK), "--json", "--quiet")], ids=["catalog", "solve"])
def test_closed_stdout_is_one_line_exit_2_and_nothing_done(tmp_path, args):
    out = tmp_path / "sol.json"
    extra = ("-o", str(out)) if args[0] == "solve" else ()
    r = cli(*args, *extra, shell_suffix=">&-")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert one_line(r.stderr) == ("autoshard: error: <stdout>: standard output is closed; redirect it "
                                  "(> /dev/null to discard it)")
    assert not out.exists()
    r = cli(*args, shell_suffix=">&- 2>&-")  # stderr closed too: the exit code alone
    assert r.returncode == 2 and r.stderr == ""


# ---- 13: a schedule the framework lacks ------------------------------------------------------------

@pytest.mark.parametrize("framework, schedule", [("torchtitan", "dualpipev"), ("maxtext", "interleaved"),
                                                  ("megatron", "dualpipev"), ("deepspeed", "interleaved")])
def test_search_schedule_the_framework_cannot_plan_is_bad_input(tmp_path, capsys, framework, schedule):
    doc = yaml.safe_load(OK.read_text())
    doc["framework"] = framework
    doc["search"] = {"schedule": schedule}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    rc, out, err = main(capsys, "solve", str(tmp_path / "p.yaml"), "--quiet")
    line = one_line(err)
    assert rc == 2 and out == "" and "p.yaml: search.schedule: " in line
    runs = profiles()[framework].schedules  # the framework profile's own list (data/frameworks.yaml)
    if schedule in runs:  # torchtitan runs DualPipeV, but the solver prices it, never plans it
        assert "the solver does not plan 'dualpipev'" in line
    else:
        assert f"{framework} has no '{schedule}' pipeline schedule (it runs {', '.join(runs)}" in line


# ---- 14: Hugging Face layer_types --------------------------------------------------------------------

@pytest.mark.parametrize("layer_types, field, want", [
    (["sliding_attention"] * 3, "layer_types", "has 3 entries for num_hidden_layers (32)"),
    ("sliding_attention", "layer_types", "must be a list of one layer type per layer, got a str"),
    (["full_attention"] * 31 + ["sliding_atention"], "layer_types.31", "'sliding_atention' is not a layer type"),
    (["full_attention"] * 31 + ["linear_attention"], "layer_types.31",
     "'linear_attention' is an attention autoshard does not price"),
    (["full_attention"] * 31 + [None], "layer_types.31", "None is not a layer type"),
])
def test_hf_layer_types_are_checked(tmp_path, capsys, prob, layer_types, field, want):
    cfg = json.loads(HF.read_text())
    assert cfg["num_hidden_layers"] == 32
    cfg.update({"sliding_window": 4096, "layer_types": layer_types})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rc, out, err = main(capsys, "solve", str(prob), "--hf-config", str(path), "--quiet")
    line = one_line(err)
    assert rc == 2 and out == "" and f"{path}: {field}: {want}" in line, line


def test_hf_layer_types_price_the_sliding_share():
    from autoshard.hf import model_from_hf_config  # noqa: PLC0415

    cfg = {**json.loads(HF.read_text()), "sliding_window": 4096,
           "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"] * 8}
    assert model_from_hf_config(cfg).sliding_window_layers == 24 / 32


# ---- 15: --plan with a knob twice --------------------------------------------------------------------

def test_inline_plan_with_a_knob_twice_is_refused(capsys, prob):
    for cmd in (("evaluate", str(prob), "--plan", "tp=2,tp=1"), ("compare", str(prob), "--plan", "tp=1,pp=1,tp=2",
                                                                  "--plan", "tp=1")):
        rc, out, err = main(capsys, *cmd)
        assert rc == 2 and out == "" and "--plan: tp: duplicate key 'tp'" in one_line(err)


# ---- 16: batch goes on past a record it cannot write -------------------------------------------------

def test_batch_reports_a_record_it_cannot_write_and_goes_on(tmp_path, capsys):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    for name in ("a", "b"):
        shutil.copyfile(OK, src / f"{name}.yaml")
    (out / "a.json").mkdir()  # a.json cannot be written: a directory stands there
    rc, stdout, _ = main(capsys, "batch", str(src), "-o", str(out), "--quiet")
    assert rc == 2  # non-zero at the end
    rows = {r.split(",")[0]: r for r in (out / "summary.csv").read_text().splitlines()[1:]}
    assert rows["a"].startswith("a,error,") and f"{out / 'a.json'}: cannot write the output: is a directory" in rows["a"]
    assert rows["b"].startswith("b,optimal,") and (out / "b.json").is_file() and (out / "b.md").is_file()
    assert "1 optimal, 1 error" in stdout


def test_batch_record_never_replaces_an_input_problem(tmp_path, capsys):
    """`batch out/a.json -o out`: a.json's record would be out/a.json, the problem itself."""
    out = tmp_path / "out"
    out.mkdir()
    problem = out / "a.json"
    problem.write_text(json.dumps(yaml.safe_load(OK.read_text())))
    before = problem.read_bytes()
    rc, stdout, _ = main(capsys, "batch", str(problem), "-o", str(out), "--quiet")
    assert rc == 2 and problem.read_bytes() == before and not (out / "a.md").exists()
    assert f"{problem}: its record would replace the input {problem}" in (out / "summary.csv").read_text()


def test_whatif_outputs_never_replace_the_study(tmp_path, capsys):
    study = tmp_path / "results.json"  # a study (JSON) where `whatif -o` writes its results.json
    study.write_text(json.dumps(yaml.safe_load((ROOT / "problems" / "studies" / "cloud-vs-buy.yaml").read_text())))
    before = study.read_bytes()
    rc, out, err = main(capsys, "whatif", str(study), "-o", str(tmp_path), "--quiet")
    assert rc == 2 and out == "" and "--output: results.json would replace the study file" in one_line(err)
    assert study.read_bytes() == before


def test_every_file_input_refuses_a_fifo_at_once(tmp_path):
    """The one reader behind every input: a FIFO given as the problem, a plan, a solution, an
    --hf-config, a calibrated catalog named by the problem or a measured-runs file is exit 2 at once."""
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    jfifo = tmp_path / "f.json"
    os.mkfifo(jfifo)
    doc = yaml.safe_load(OK.read_text())
    doc["cluster"]["catalog"] = str(fifo)
    (tmp_path / "cat.yaml").write_text(yaml.safe_dump(doc))
    for args in (("solve", str(fifo)), ("evaluate", str(OK), "--plan", str(fifo)),
                 ("export", str(jfifo), "--format", "megatron"), ("solve", str(OK), "--hf-config", str(jfifo)),
                 ("solve", str(tmp_path / "cat.yaml")), ("calibrate", str(jfifo), "-o", str(tmp_path / "c.yaml"))):
        r = cli(*args, timeout=60)
        assert r.returncode == 2 and "not a regular file (a FIFO, socket or device)" in one_line(r.stderr), args
