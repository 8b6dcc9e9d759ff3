"""Issue #6: every bad input and fault gives the documented exit code and one line on stderr.

- The corpus `tests/data/bad/` (table: `cases.yaml`) runs through the CLI in-process
  (`autoshard.cli.main`, fast) for `solve` and `evaluate`; a sample of it, the YAML-tag
  code execution attempt, infeasibility and `batch` also run as real subprocesses.
- Inputs that cannot live in a repository (a directory, a missing file, a FIFO, symlink loops,
  an oversized file, a newline in a file name) are made in a temporary directory.
- Determinism: the same input gives the same plan and estimate byte for byte (timing aside),
  across processes and across `--jobs` of a what-if study (batch jobs / file order: test_batch).
- Time limits: a solve that hits its limit returns its best plan as FEASIBLE with the gap, and
  never runs past the limit by more than a small margin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoshard import cli
from autoshard import loader as loader_mod
from autoshard.errors import AutoshardError, InfeasibleError
from autoshard.loader import load_problem
from autoshard.solver import solve

ROOT = Path(__file__).resolve().parents[1]
BAD = Path("tests/data/bad")  # relative: the tests run at the repository root (see `at_root`)
OK = str(BAD / "ok_problem.yaml")
CASES: dict[str, dict[str, Any]] = yaml.safe_load((ROOT / BAD / "cases.yaml").read_text(encoding="utf-8"))
NOT_CASES = {"cases.yaml", "ok_problem.yaml"}
TINY = {"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch_size": 16},
        "cluster": {"gpu": "h100", "num_gpus": 8},
        "search": {"tp": [1, 2], "pp": [1, 2], "micro_batch_size": [1], "zero_stage": [1]}}
INFEASIBLE = {"model": "llama3-405b", "training": {"seq_len": 2048, "global_batch_size": 16},
              "cluster": {"gpu": "rtx-4090", "num_gpus": 8}}
# An exact proof (gap limit 0) of the seed problem takes far longer than 2 s (10 s on the 2-core
# machine: many interleaved configurations tie within 0.1% under memory pressure).
LIMIT_PROBLEM = ROOT / "problems" / "llama3-70b-640xh100.yaml"
SUBPROCESS_TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def run_cli(*args: str, timeout: float = SUBPROCESS_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """The real command line, in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "autoshard.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def main(capsys, *args: str) -> tuple[int, str, str]:
    """`autoshard ARGS` in this process: (exit code, stdout, stderr)."""
    try:
        rc = cli.main(list(args))
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"expected exactly one line on stderr, got {err!r}"
    return lines[0]


def runs(name: str, case: dict[str, Any], out: Path) -> list[list[str]]:
    path = str(BAD / name)
    return {
        "problem": [["solve", path, "-o", str(out / "out.json")], ["evaluate", path]],
        "evaluate": [["evaluate", path]],
        "plan": [["evaluate", OK, "--plan", path]],
        "hf_config": [["solve", OK, "--hf-config", path, "-o", str(out / "out.json")]],
    }[case["run"]]


def check_error_line(err: str, path: str, case: dict[str, Any]) -> str:
    line = one_line(err)
    assert line.startswith("autoshard: error: "), line
    assert path in line, line
    if case.get("field"):
        assert f"{path}: {case['field']}: " in line, line
    for fragment in case.get("expect", []):
        assert fragment in line, (fragment, line)
    return line


# ---- the corpus ---------------------------------------------------------------------------------


def test_every_corpus_file_is_in_the_table():
    files = {p.name for p in (ROOT / BAD).iterdir() if not p.name.startswith("aux_")} - NOT_CASES
    assert files == set(CASES)
    for name, case in CASES.items():
        assert case["run"] in ("problem", "evaluate", "plan", "hf_config"), name
        assert case["exit"] in (1, 2), name


@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_case(name, tmp_path, capsys):
    case = CASES[name]
    for argv in runs(name, case, tmp_path):
        rc, out, err = main(capsys, *argv)
        assert rc == case["exit"], (argv, out, err)
        if case["exit"] == 2:
            check_error_line(err, str(BAD / name), case)
            assert out == "", "nothing on stdout for bad input"
        else:
            assert err == "" and "INVALID PLAN" in out
            for fragment in case.get("stdout", []):
                assert fragment in out, (fragment, out)
        assert list(tmp_path.iterdir()) == [], "nothing may be written"


def test_unknown_names_give_the_closest_valid_names(capsys):
    hinted = [n for n, c in CASES.items() if n.startswith("unknown_") and c["run"] == "problem"]
    assert len(hinted) >= 8
    for name in hinted:
        _, _, err = main(capsys, "evaluate", str(BAD / name))
        assert "(closest: " in err, err


def test_plan_whose_degrees_do_not_divide_lists_every_reason(capsys):
    rc, out, err = main(capsys, "evaluate", OK, "--plan", str(BAD / "plan_degrees_do_not_divide.yaml"))
    assert rc == 1 and err == ""
    reasons = ["tp*cp*pp = 15 does not divide the 8 GPUs", "tp=3 does not divide num_attention_heads=32",
               "tp=3 and num_key_value_heads=8: neither divides the other",
               "tp=3 does not divide intermediate_size=14336", "vpp=2 needs schedule 'interleaved'",
               "stage_layers has 2 entries, expected pp*vpp = 10"]
    for r in reasons:
        assert f"  - {r}" in out, (r, out)
    rc, out, _ = main(capsys, "evaluate", OK, "--plan", str(BAD / "plan_degrees_do_not_divide.yaml"), "--json")
    est = json.loads(out)
    assert rc == 1 and est["fits"] is False and len(est["reasons"]) == len(reasons)


SUBPROCESS_SAMPLE = ["yaml_syntax_unclosed_mapping.yaml", "json_syntax_trailing_comma.json", "non_utf8_latin1.yaml",
                     "unknown_field_training.yaml", "wrong_type_num_gpus_bool.yaml", "unknown_gpu.yaml",
                     "deeply_nested.json", "search_tp_does_not_divide_gpus.yaml", "hf_config_bert_encoder.json"]


@pytest.mark.parametrize("name", SUBPROCESS_SAMPLE)
def test_corpus_sample_in_a_real_process(name, tmp_path):
    case = CASES[name]
    argv = runs(name, case, tmp_path)[0]
    proc = run_cli(*argv)
    assert proc.returncode == case["exit"], proc
    check_error_line(proc.stderr, str(BAD / name), case)
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []


def test_python_yaml_tag_is_never_executed(tmp_path):
    pwned = tmp_path / "pwned"
    bad = tmp_path / "exploit.yaml"
    bad.write_text(f'model: !!python/object/apply:os.system ["touch {pwned}"]\n'
                   "training: {seq_len: 2048, global_batch_size: 16}\ncluster: {gpu: h100, num_gpus: 8}\n")
    for argv in (["solve", str(bad), "-o", str(tmp_path / "out.json")], ["evaluate", str(bad)],
                 ["evaluate", OK, "--plan", str(bad)], ["batch", str(bad), "-o", str(tmp_path / "batch")]):
        proc = run_cli(*argv)
        assert proc.returncode == 2, proc
        assert not pwned.exists(), f"{argv}: the YAML tag was executed"
        if argv[0] != "batch":
            line = one_line(proc.stderr)
            assert str(bad) in line and "YAML tags that construct Python objects are not allowed" in line
    assert not (tmp_path / "out.json").exists()
    rec = json.loads((tmp_path / "batch" / "exploit.json").read_text())
    assert rec["error"]["kind"] == "input" and "YAML tags" in rec["error"]["message"]


# ---- inputs made at run time ------------------------------------------------------------------


def _make(kind: str, tmp: Path) -> Path:
    if kind == "directory":
        (tmp / "problem.yaml").mkdir()
        return tmp / "problem.yaml"
    if kind == "missing":
        return tmp / "no-such-problem.yaml"
    if kind == "fifo":
        os.mkfifo(tmp / "fifo.yaml")
        return tmp / "fifo.yaml"
    if kind == "symlink_loop":
        os.symlink("loop.yaml", tmp / "loop.yaml")
        return tmp / "loop.yaml"
    if kind == "broken_symlink":
        os.symlink("gone.yaml", tmp / "dangling.yaml")
        return tmp / "dangling.yaml"
    raise AssertionError(kind)


SPECIAL = {"directory": "is a directory, expected a problem file", "missing": "no such file",
           "fifo": "not a regular file", "symlink_loop": "symbolic link loop",
           "broken_symlink": "broken symbolic link (to gone.yaml)"}


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_special_files(kind, tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    path = _make(kind, inputs)
    out = tmp_path / "out"
    out.mkdir()
    for argv in (["solve", str(path), "-o", str(out / "out.json")], ["evaluate", str(path)],
                 ["evaluate", OK, "--plan", str(path)], ["solve", OK, "--hf-config", str(path)]):
        rc, stdout, err = main(capsys, *argv)
        assert rc == 2, (argv, err)
        line = one_line(err)
        assert str(path) in line, line
        if argv[1] != OK or argv[2] == "--plan":
            assert SPECIAL[kind] in line, line
        assert stdout == "" and list(out.iterdir()) == []


def test_special_files_in_a_real_process(tmp_path):
    path = _make("fifo", tmp_path)  # would block forever if it were opened
    proc = run_cli("solve", str(path), timeout=60)
    assert proc.returncode == 2 and SPECIAL["fifo"] in one_line(proc.stderr)


def test_oversized_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loader_mod, "MAX_FILE_BYTES", 64)
    big = tmp_path / "big.yaml"
    big.write_text("model: llama3-8b\n" + "# padding\n" * 20)
    rc, _, err = main(capsys, "solve", str(big))
    assert rc == 2 and "larger than the 64 allowed" in one_line(err)


def test_newline_in_a_file_name_keeps_one_line(tmp_path, capsys):
    odd = tmp_path / "two\nlines.yaml"
    odd.write_text("model: llama3-8b\n")
    rc, _, err = main(capsys, "solve", str(odd))
    line = one_line(err)
    assert rc == 2 and "two\\nlines.yaml" in line and "training: required field is missing" in line


def test_evaluate_without_a_plan(capsys):
    rc, out, err = main(capsys, "evaluate", OK)
    assert rc == 2 and out == ""
    assert one_line(err) == f"autoshard: error: {OK}: no --plan given and the problem file has no `plan:` section"


# ---- bad options --------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,fragment", [
    (["solve", OK, "--time-limit", "0"], "--time-limit: must be a number of seconds > 0, got 0"),
    (["solve", OK, "--time-limit", "-5"], "--time-limit: must be a number of seconds > 0, got -5"),
    (["solve", OK, "--time-limit", "nan"], "--time-limit: must be a number of seconds > 0, got nan"),
    (["solve", OK, "--time-limit", "inf"], "--time-limit: must be a number of seconds > 0, got inf"),
    (["solve", OK, "--top", "-1"], "--top: must be >= 0, got -1"),
    (["batch", OK, "-o", "unused", "--time-limit", "0"], "--time-limit: must be a number of seconds > 0"),
    (["whatif", "problems/studies/cloud-vs-buy.yaml", "-o", "unused", "--time-limit", "-1"], "--time-limit"),
    (["solve", OK, "--time-limit", "abc"], "argument --time-limit: invalid float value: 'abc'"),
    (["solve"], "the following arguments are required: PROBLEM"),
    (["solve", OK, "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["export", OK, "--format", "pytorch"], "invalid choice: 'pytorch'"),
    (["collective", "all_reduce", "1GB", "--cluster", "dgx-h100-superpot", "--gpus", "8"],
     "cluster.topology: unknown topology 'dgx-h100-superpot' (closest: dgx-h100-superpod"),
    (["collective", "all_reduce", "lots", "--cluster", "dgx-h100-superpod", "--gpus", "8"], "BYTES: not a byte count"),
    (["collective", "all_reduce", "1GB", "--cluster", "dgx-h100-superpod", "--gpus", "0"], "--gpus: must be >= 1"),
])
def test_bad_options(argv, fragment, capsys, tmp_path):
    rc, out, err = main(capsys, *argv)
    assert rc == 2 and out == ""
    assert fragment in one_line(err)
    assert not (ROOT / "unused").exists()


def test_output_that_cannot_be_written(tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("a regular file\n")
    rc, out, err = main(capsys, "solve", OK, "-o", str(blocker / "out.json"))
    assert rc == 2 and out == "" and f"--output: cannot write here: {blocker} is not a directory" in one_line(err)
    rc, out, err = main(capsys, "solve", OK, "-o", str(tmp_path))
    assert rc == 2 and "--output: is a directory" in one_line(err)


def test_whatif_unwritable_output_fails_before_solving(tmp_path, capsys, monkeypatch):
    import autoshard.whatif as whatif_mod

    def boom(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("solved before checking the output directory")

    monkeypatch.setattr(whatif_mod, "_execute", boom)
    blocker = tmp_path / "file.txt"
    blocker.write_text("a regular file\n")
    rc, out, err = main(capsys, "whatif", "problems/studies/cloud-vs-buy.yaml", "-o", str(blocker / "out"))
    assert rc == 2 and out == "" and "cannot create the output directory" in one_line(err)
    rc, out, err = main(capsys, "whatif", "problems/studies/cloud-vs-buy.yaml", "-o", str(blocker))
    assert rc == 2 and "exists and is not a directory" in one_line(err)


def test_other_autoshard_errors_and_interrupts_are_one_line(capsys, monkeypatch):
    import autoshard.whatif as whatif_mod

    def fail(*a, **k):
        raise AutoshardError("every option failed to solve (see out/results.json); the first: boom\nmore")

    monkeypatch.setattr(whatif_mod, "run_study", fail)
    rc, _, err = main(capsys, "whatif", "problems/studies/cloud-vs-buy.yaml", "-o", "unused")
    assert rc == 2 and one_line(err).startswith("autoshard: error: every option failed to solve")

    import autoshard.solver as solver_mod

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(solver_mod, "solve", interrupt)
    rc, _, err = main(capsys, "solve", OK)
    assert rc == 130 and "interrupted" in one_line(err)


# ---- infeasible problems ---------------------------------------------------------------------------


def test_infeasible_names_the_binding_constraint_and_a_fix(tmp_path):
    path = tmp_path / "llama3-405b-8xrtx4090.yaml"
    path.write_text(yaml.safe_dump(INFEASIBLE))
    out = tmp_path / "out.json"
    proc = run_cli("solve", str(path), "-o", str(out))
    assert proc.returncode == 1, proc
    line = one_line(proc.stderr)
    assert line.startswith(f"{path}: infeasible: even with ")
    assert " needs " in line and " GiB of " in line and "rtx-4090" in line
    assert "to fix: " in line and ("more GPUs" in line or "larger-HBM" in line)
    assert not out.exists()
    proc = run_cli("solve", str(path), "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["status"] == "INFEASIBLE" and doc["reason"].startswith("even with")
    assert any("more GPUs" in s for s in doc["suggestions"])


# ---- batch --------------------------------------------------------------------------------------


def test_batch_cli_with_a_symlink_loop_and_a_bad_file(tmp_path):
    inp = tmp_path / "in"
    (inp / "sub").mkdir(parents=True)
    (inp / "sub" / "tiny.json").write_text(json.dumps(TINY))
    (inp / "broken.yaml").write_text("model: llama3-8b\ntraining: {seq_len: 2048\n")
    os.symlink(inp, inp / "sub" / "back")  # a link to an ancestor: a loop
    os.symlink("self.yaml", inp / "self.yaml")  # a link to itself
    out = tmp_path / "out"
    proc = run_cli("batch", str(inp), "-o", str(out), "--quiet", "--time-limit", "30", timeout=120)
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    recs = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert set(recs) == {"tiny", "broken", "back", "self"}
    assert recs["tiny"]["status"] == "optimal"
    assert "symbolic link loop" in recs["back"]["error"]["message"]
    assert "symbolic link loop" in recs["self"]["error"]["message"]
    assert recs["broken"]["error"]["kind"] == "input" and "YAML syntax error" in recs["broken"]["error"]["message"]
    assert (out / "summary.csv").is_file()


def test_batch_cli_unwritable_output_fails_before_solving(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("a regular file\n")
    t0 = time.perf_counter()
    # An exact proof of this problem takes over 10 s: a quick exit proves nothing was solved.
    proc = run_cli("batch", str(LIMIT_PROBLEM), "-o", str(blocker / "out"), "--time-limit", "60", "--gap", "0",
                   timeout=60)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 2 and proc.stdout == ""
    line = one_line(proc.stderr)
    assert str(blocker / "out") in line and "output directory" in line
    assert elapsed < 5, f"took {elapsed:.1f} s: it solved before checking the output directory"


# ---- determinism ------------------------------------------------------------------------------------


def _drop_timing(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _drop_timing(v) for k, v in doc.items() if k not in ("solve_time_s", "timing", "elapsed_s")}
    if isinstance(doc, list):
        return [_drop_timing(v) for v in doc]
    return doc


def test_solve_json_is_byte_identical_across_processes(tmp_path):
    texts = []
    for i in range(2):
        out = tmp_path / f"run{i}.json"
        proc = run_cli("solve", OK, "--json", "-o", str(out))
        assert proc.returncode == 0, proc
        stdout = json.loads(proc.stdout)
        assert stdout == json.loads(out.read_text())
        texts.append(json.dumps(_drop_timing(stdout), sort_keys=True))
    assert texts[0] == texts[1]
    assert json.loads(texts[0])["solver"]["status"] == "OPTIMAL"


def test_evaluate_output_is_byte_identical(tmp_path, capsys):
    rc, out, _ = main(capsys, "solve", OK, "--json")
    assert rc == 0
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(json.loads(out)["plan"]))
    texts = set()
    for _ in range(3):
        rc, out, _ = main(capsys, "evaluate", OK, "--plan", str(plan), "--json")
        assert rc == 0
        texts.add(out)
    assert len(texts) == 1


def test_whatif_is_identical_across_jobs(tmp_path):
    from autoshard.whatif import run_study

    study = {"name": "jobs", "workloads": [{"model": "llama3-8b", "tokens": 5.0e10,
                                            "training": {"seq_len": 4096, "global_batch_size": 64},
                                            "search": {"tp": [1, 2], "pp": [1, 2], "cp": 1}}],
             "options": [{"gpu": "h100-sxm", "num_gpus": [8, 16]}, {"gpu": "b200", "num_gpus": 8}],
             "pricing": {"mode": ["cloud"]}, "sensitivity": "off", "time_limit_s": 10.0}
    a = run_study(study, tmp_path / "a", jobs=1, report=False).document
    b = run_study(study, tmp_path / "b", jobs=3, report=False).document
    a, b = _drop_timing(a), _drop_timing(b)
    a.pop("jobs", None), b.pop("jobs", None)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


# ---- time limits -------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1.0, 2.0])
def test_time_limit_returns_best_plan_with_gap(limit):
    problem = load_problem(LIMIT_PROBLEM)
    t0 = time.perf_counter()
    try:
        sol = solve(problem, time_limit_s=limit, top_k=1, gap_limit=0.0)
    except InfeasibleError as exc:  # pragma: no cover - not on this problem (found in < 1 s), kept as the contract
        elapsed = time.perf_counter() - t0
        assert "no plan found within" in str(exc)
        assert elapsed <= limit + 3
        pytest.fail(f"no plan within {limit} s: {exc}")
    elapsed = time.perf_counter() - t0
    assert elapsed <= limit + 3, f"ran {elapsed:.1f} s with a {limit} s limit"
    st = sol.solver
    assert st.status == "FEASIBLE"
    assert st.gap is not None and 0 < st.gap < 1
    assert st.objective_bound_s <= st.objective_s + st.rounding_tolerance_s
    assert sol.estimate.fits and sol.estimate.step_time_s > 0
    assert st.solve_time_s <= limit + 3


def test_time_limit_in_a_real_process():
    t0 = time.perf_counter()
    proc = run_cli("solve", str(LIMIT_PROBLEM), "--time-limit", "2", "--gap", "0", "--json")
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc
    doc = json.loads(proc.stdout)
    assert doc["solver"]["status"] == "FEASIBLE" and doc["solver"]["gap"] > 0
    assert elapsed <= 2 + 5, f"{elapsed:.1f} s including interpreter start-up"
