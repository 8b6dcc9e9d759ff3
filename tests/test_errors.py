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
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoshard import cli
from cli_helpers import one_line
from cli_helpers import run_cli as run_in_process
from autoshard import fileio as fileio_mod
from autoshard.errors import AutoshardError, InfeasibleError, InputError
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
# An exact proof (gap limit 0) of this problem takes far longer than 2 s (see the file; the seed problem
# and Llama 3 405B on 16,384 H100, proven exactly in 1.6-2.7 s by the solver's descent, no longer serve).
LIMIT_PROBLEM = ROOT / "tests" / "data" / "hard_proof_moe.yaml"
SUBPROCESS_TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def run_cli(*args: str, timeout: float = SUBPROCESS_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """The real command line, in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "autoshard.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


main = run_in_process


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
        else:  # the report on stdout, every reason on stderr naming the plan's file
            assert "INVALID PLAN" in out and "dp?" not in out and "Traceback" not in err
            plan_file = argv[-1] if "--plan" in argv else argv[1]
            lines = err.splitlines()
            assert lines and all(ln.startswith(f"autoshard: infeasible: {plan_file}: ") for ln in lines), err
            for fragment in case.get("stdout", []):
                assert fragment in err, (fragment, err)
        assert list(tmp_path.iterdir()) == [], "nothing may be written"


def test_unknown_names_give_the_closest_valid_names(capsys):
    hinted = [n for n, c in CASES.items() if n.startswith("unknown_") and c["run"] == "problem"]
    assert len(hinted) >= 8
    for name in hinted:
        _, _, err = main(capsys, "evaluate", str(BAD / name))
        assert "(closest: " in err, err


def test_plan_whose_degrees_do_not_divide_lists_every_reason(capsys):
    """An invalid plan is bad input (exit 2, as in `compare`): one line naming the plan file, the field
    of the first reason and every reason; nothing on stdout, with or without --json."""
    plan = str(BAD / "plan_degrees_do_not_divide.yaml")
    reasons = ["tp*cp*pp = 15 does not divide the 8 GPUs", "tp=3 does not divide num_attention_heads=32",
               "tp=3 and num_key_value_heads=8: neither divides the other",
               "tp=3 does not divide intermediate_size=14336",
               "sequence parallelism splits the 2048 tokens over tp=3: not divisible",
               "vpp=2 needs schedule 'interleaved' (got '1f1b')",
               "stage_layers has 2 entries, expected pp*vpp = 10"]
    for extra in ((), ("--json",)):
        rc, out, err = main(capsys, "evaluate", OK, "--plan", plan, *extra)
        assert rc == 2 and out == ""
        assert one_line(err) == f"autoshard: error: {plan}: tp: invalid plan: " + "; ".join(reasons)


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
    monkeypatch.setattr(fileio_mod, "MAX_FILE_BYTES", 64)
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
    (["collective", "all_reduce", "1e400", "--cluster", "dgx-h100-superpod", "--gpus", "8"],
     "BYTES: 1e400 is larger than the 1.15e+18 bytes allowed"),
    (["collective", "all_reduce", "1e400", "--cluster", "dgx-h100-superpod", "--gpus", "8", "--json"],
     "BYTES: 1e400 is larger than"),
    (["collective", "all_reduce", "1GB", "--cluster", "dgx-h100-superpod", "--gpus", "1048577"],
     "--gpus: Input should be less than or equal to 1048576 (got 1048577)"),
    (["solve", OK, "-o", ""], "--output: must be a file or folder name, got an empty string"),
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


def test_batch_cli_unwritable_output_fails_before_solving(tmp_path, capsys, monkeypatch):
    """The output directory is checked before anything is solved: a solve here would fail the test
    (rather than timing the process, which a loaded machine stretches)."""
    import autoshard.solver  # noqa: PLC0415

    def no_solve(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("batch solved before checking its output directory")

    monkeypatch.setattr(autoshard.solver, "solve", no_solve)
    blocker = tmp_path / "file.txt"
    blocker.write_text("a regular file\n")
    rc, out, err = run_in_process(capsys, "batch", str(LIMIT_PROBLEM), "-o", str(blocker / "out"))
    assert rc == 2 and out == ""
    line = one_line(err)
    assert str(blocker / "out") in line and "output directory" in line


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
    """The safety net stops a real process's solve and says so in the record (the solver's own
    account, not the process's wall time, which start-up on a loaded machine stretches)."""
    proc = run_cli("solve", str(LIMIT_PROBLEM), "--time-limit", "2", "--gap", "0", "--work-limit", "1000", "--json")
    assert proc.returncode == 0, proc
    doc = json.loads(proc.stdout)
    assert doc["solver"]["status"] == "FEASIBLE" and doc["solver"]["gap"] > 0
    assert doc["solver"]["stopped_by"] == "wall-clock safety net"


# ---- issue 15: output paths, duplicate keys, sizes, measured-run files -------------------------------


def test_output_symlink_is_written_through(tmp_path, capsys):
    real = tmp_path / "real.json"
    real.write_text("old\n")
    link = tmp_path / "link.json"
    os.symlink("real.json", link)
    rc, _, err = main(capsys, "solve", OK, "-o", str(link), "--top", "0")
    assert rc == 0, err
    assert link.is_symlink() and os.readlink(link) == "real.json", "the link itself was replaced"
    assert json.loads(real.read_text())["status"] == "optimal"


def test_output_named_pipe_is_written_through_never_replaced(tmp_path, capsys):
    fifo = tmp_path / "out.md"
    os.mkfifo(fifo)
    # No reader: one line, exit 2, and the pipe is still a pipe (not a hang, not a regular file).
    rc, out, err = main(capsys, "solve", OK, "-o", str(fifo), "--top", "0")
    assert rc == 2 and "named pipe with no reader" in one_line(err)
    assert stat_is_fifo(fifo)
    # With a reader holding it open, the markdown goes through the pipe.
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        rc, _, err = main(capsys, "solve", OK, "-o", str(fifo), "--top", "0")
        assert rc == 0, err
        got = os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)
    assert stat_is_fifo(fifo) and got.startswith("#") and "tp" in got


def stat_is_fifo(path: Path) -> bool:
    import stat  # noqa: PLC0415

    return stat.S_ISFIFO(os.lstat(path).st_mode)


def test_atomic_write_character_device_written_through_regular_file_keeps_mode(tmp_path):
    from autoshard.fileio import atomic_write  # noqa: PLC0415

    dev = Path(os.devnull)
    before = os.stat(dev)
    atomic_write(dev, "x" * 1000)  # written through: /dev/null stays the same device
    after = os.stat(dev)
    assert (after.st_ino, after.st_rdev, after.st_mode) == (before.st_ino, before.st_rdev, before.st_mode)
    f = tmp_path / "keep.txt"
    f.write_text("old")
    os.chmod(f, 0o640)
    atomic_write(f, "new")
    assert f.read_text() == "new" and (os.stat(f).st_mode & 0o777) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"], "no temporary file left behind"


@pytest.mark.parametrize("argv", [
    ["solve", OK, "-o", ""],
    ["export", "solutions/llama3-8b-64xh100.json", "--format", "megatron", "-o", ""],
    ["batch", OK, "-o", ""],
    ["calibrate", "runs.csv", "-o", ""],
])
def test_empty_output_path_is_rejected(argv, capsys):
    rc, out, err = main(capsys, *argv)
    assert rc == 2 and out == ""
    assert "--output: must be a file or folder name, got an empty string" in one_line(err)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_stdout_on_a_full_disk_is_one_line():
    with open("/dev/full", "w") as full:
        for argv in (["solve", OK, "--json", "--top", "0"], ["catalog"]):
            proc = subprocess.run([sys.executable, "-m", "autoshard.cli", *argv], cwd=ROOT, stdout=full,
                                  stderr=subprocess.PIPE, text=True, timeout=SUBPROCESS_TIMEOUT_S,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
            assert proc.returncode == 2, proc.stderr
            assert "<stdout>: cannot write: No space left on device" in one_line(proc.stderr)


def test_duplicate_key_in_a_study_file(tmp_path, capsys):
    study = (ROOT / "problems" / "studies" / "cloud-vs-buy.yaml").read_text()
    dup = tmp_path / "study.yaml"
    lines = study.splitlines()
    first = next(ln for ln in lines if ln and not ln[0].isspace() and not ln.startswith("#") and ":" in ln)
    dup.write_text(study + "\n" + first + "\n")
    rc, out, err = main(capsys, "whatif", str(dup), "-o", str(tmp_path / "out"))
    key = first.split(":")[0]
    assert rc == 2 and f"duplicate key '{key}'" in one_line(err) and f"line {len(lines) + 2}" in err
    assert not (tmp_path / "out").exists()


def test_size_is_checked_before_reading(tmp_path, capsys):
    sparse = tmp_path / "huge.yaml"
    with open(sparse, "wb") as fh:  # 20 GiB on paper, nothing on disk
        fh.truncate(20 * 2**30)
    t0 = time.perf_counter()
    rc, _, err = main(capsys, "solve", str(sparse))
    assert rc == 2 and "21,474,836,480 bytes, larger than the 1,048,576 allowed (1 MiB)" in one_line(err)
    assert time.perf_counter() - t0 < 2
    js = tmp_path / "huge.json"
    with open(js, "wb") as fh:
        fh.truncate(9 * 2**20)
    rc, _, err = main(capsys, "evaluate", OK, "--plan", str(js))
    assert rc == 2 and "larger than the 8,388,608 allowed (8 MiB)" in one_line(err)


def test_largest_allowed_yaml_parses_quickly(tmp_path, capsys):
    """Just under the 1 MiB limit, the densest YAML (tiny flow mappings) parses in a few seconds
    (a 14.9 MB file took 61 s before the limit and libyaml)."""
    from autoshard.fileio import MAX_YAML_BYTES, read_document  # noqa: PLC0415

    row = "  - {a: 1, b: [1, 2]}\n"
    doc = tmp_path / "dense.yaml"
    doc.write_text("x:\n" + row * ((MAX_YAML_BYTES - 10) // len(row)))
    t0 = time.process_time()  # CPU seconds: a loaded machine stretches wall time, not this
    assert len(read_document(doc)["x"]) > 40_000
    assert time.process_time() - t0 < 10


def _runs_csv(tmp_path: Path, edit=None, delimiter: str = ",", drop: tuple[str, ...] = ()) -> Path:
    import csv  # noqa: PLC0415

    from autoshard.validate import default_runs_path  # noqa: PLC0415

    rows = [r for r in json.loads(Path(default_runs_path()).read_text()) if r["id"].startswith("dgxc_v24.11_gpt3")][:4]
    if edit:
        edit(rows)
    cols = [c for c in sorted({k for r in rows for k in r}) if c not in drop]
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, delimiter=delimiter, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r.get(k) is None else r[k] for k in cols})
    return path


def _set(i: int, key: str, value: Any):
    def edit(rows: list[dict[str, Any]]) -> None:
        rows[i][key] = value(rows) if callable(value) else value
    return edit


@pytest.mark.parametrize("kind,make,fragment", [
    ("non-numeric", lambda t: _runs_csv(t, _set(1, "step_time_s", "fast")),
     "runs.csv: row 2 (line 3), column step_time_s: not a number ('fast')"),
    ("inf", lambda t: _runs_csv(t, _set(2, "step_time_s", "inf")),
     "runs.csv: row 3 (line 4), column step_time_s: not a finite number (inf)"),
    ("absurd", lambda t: _runs_csv(t, _set(0, "step_time_s", 1e308)),
     "runs.csv: row 1 (line 2), column step_time_s: 1e+308 is outside the plausible range [0.0001, 86400]"),
    ("fraction of a GPU", lambda t: _runs_csv(t, _set(0, "gpu_count", 12.5)),
     "row 1 (line 2), column gpu_count: not a whole number (12.5)"),
    ("duplicate id", lambda t: _runs_csv(t, _set(3, "id", lambda rows: rows[0]["id"])),
     "row 4 (line 5), column id: duplicate run id 'dgxc_v24.11_gpt3_175b_bf16_128gpu' (first at row 1 (line 2))"),
    ("semicolons", lambda t: _runs_csv(t, delimiter=";"),
     "runs.csv: line 1: the columns are separated by semicolons; autoshard reads comma-separated CSV"),
    ("missing columns", lambda t: _runs_csv(t, drop=("gpu", "step_time_s", "tokens_per_sec", "tflops_per_gpu")),
     "runs.csv: line 1: missing column(s): gpu, step_time_s or tokens_per_sec or tflops_per_gpu"),
])
def test_bad_measured_runs_are_one_line_in_calibrate_and_validate(kind, make, fragment, tmp_path, capsys):
    path = make(tmp_path)
    out = tmp_path / "cat.yaml"
    for argv in (["calibrate", str(path), "-o", str(out)], ["validate", str(path)]):
        rc, stdout, err = main(capsys, *argv)
        assert rc == 2 and stdout == "", (kind, argv, err)
        assert fragment in one_line(err), (kind, err)
    assert not out.exists()


def test_measured_runs_json_inf_and_huge(tmp_path, capsys):
    from autoshard.validate import default_runs_path  # noqa: PLC0415

    rows = json.loads(Path(default_runs_path()).read_text())[:3]
    rows[1]["step_time_s"] = 1e308
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(rows))
    rc, _, err = main(capsys, "calibrate", str(path), "-o", str(tmp_path / "c.yaml"))
    assert rc == 2 and "runs.json: [1].step_time_s: 1e+308 is outside the plausible range" in one_line(err)
    path.write_text(json.dumps(rows).replace("1e+308", "Infinity"))
    rc, _, err = main(capsys, "validate", str(path))
    assert rc == 2 and "runs.json: JSON error: Infinity is not a number in JSON" in one_line(err)


def test_calibrate_unwritable_output_fails_before_the_fit(tmp_path, capsys, monkeypatch):
    import autoshard.calibrate as cal_mod  # noqa: PLC0415

    path = _runs_csv(tmp_path)
    blocker = tmp_path / "file.txt"
    blocker.write_text("a regular file\n")
    monkeypatch.setattr(cal_mod, "_identify", lambda *a, **k: (_ for _ in ()).throw(AssertionError("fitted")))
    rc, out, err = main(capsys, "calibrate", str(path), "-o", str(blocker / "cat.yaml"))
    assert rc == 2 and out == "" and f"--output: cannot write here: {blocker} is not a directory" in one_line(err)
    # A read-only file system (simulated: root ignores permission bits) is one line too, never a traceback.
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    from autoshard import fileio as ld  # noqa: PLC0415

    monkeypatch.setattr(ld, "_read_only_fs", lambda p: True)
    rc, out, err = main(capsys, "calibrate", str(path), "-o", str(tmp_path / "ro" / "cat.yaml"))
    assert rc == 2 and f"cannot write here: {tmp_path} is on a read-only file system" in one_line(err)


def test_calibrate_write_failure_is_one_line(tmp_path, capsys, monkeypatch):
    import errno  # noqa: PLC0415

    import autoshard.calibrate as cal_mod  # noqa: PLC0415

    def erofs(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    rows = [r for r in json.loads(Path(__import__("autoshard.validate", fromlist=["x"]).default_runs_path())
                                  .read_text()) if r["id"].startswith("narayanan")][:2]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(rows))
    monkeypatch.setattr(cal_mod, "atomic_write", erofs)
    rc, out, err = main(capsys, "calibrate", str(path), "-o", str(tmp_path / "cat.yaml"))
    assert rc == 2 and out == "" and "cat.yaml: --output: cannot write: Read-only file system" in one_line(err)


# ---- issue 15: what a new user runs first ---------------------------------------------------------


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = text.split("```bash\n")[1:3]
    return [b.split("```")[0].strip() for b in blocks]


def test_readme_test_command_works_in_a_new_shell_and_prints_the_summary():
    """The README's second command needs no activated environment, and pytest prints its count
    (a `-q` in addopts plus the command's `-q` hid it); .ci/run runs exactly that command."""
    install, test_cmd = _readme_commands()
    assert test_cmd.startswith(".venv/bin/python -m pytest"), test_cmd  # no `activate` needed
    assert ". .venv/bin/activate" in install
    ci = [ln.split("#")[0].strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_cmd in ci
    argv = shlex.split(test_cmd)[1:]  # this interpreter stands in for .venv/bin/python
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTEST_ADDOPTS")}
    proc = subprocess.run([sys.executable, *argv, "tests/test_errors.py::test_every_corpus_file_is_in_the_table",
                           "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^1 passed in [0-9.]+s", proc.stdout, re.M), proc.stdout


# ---- issue 15: `collective` prices like the solver and never prints inf/NaN ------------------------


def test_collective_applies_the_solvers_efficiencies_and_says_so(capsys):
    """all_gather of 10 GB over the 8 GPUs of one NVLink domain: ring time B (1 - 1/8) / (W eff)
    plus 7 steps of the level's latency (REFERENCE §4), W the preset's NVLink rate per GPU, eff
    h100-sxm's scale-up efficiency."""
    from autoshard.catalog import get_gpu, get_topology  # noqa: PLC0415

    level = get_topology("dgx-h100-superpod").levels[0]
    link, lat = level.bandwidth_gb_per_s * 1e9, 7 * level.latency_us * 1e-6
    eff = get_gpu("h100-sxm").efficiency.scaleup
    nbytes = 1e10
    base = ["collective", "all_gather", "10GB", "--cluster", "dgx-h100-superpod", "--gpus", "8", "--json"]
    rc, out, _ = main(capsys, *base)
    doc = json.loads(out)
    assert rc == 0 and doc["efficiency_applied"] is True
    assert doc["time_s"] == pytest.approx(nbytes * 7 / 8 / (link * eff) + lat, rel=1e-6)
    rc, out, _ = main(capsys, *base, "--raw")
    assert json.loads(out)["time_s"] == pytest.approx(nbytes * 7 / 8 / link + lat, rel=1e-6)
    rc, out, _ = main(capsys, *base[:-1])
    assert rc == 0 and "efficiencies as the solver applies them (scale-up 0.8" in out


def test_collective_json_is_strict_json(capsys):
    for gpus in ("1", "8", "4096"):
        rc, out, err = main(capsys, "collective", "all_reduce", "1.15e18", "--cluster", "dgx-h100-superpod",
                            "--gpus", gpus, "--json")
        assert rc == 0, err
        json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))


# ---- issue 15: what the text output says ----------------------------------------------------------


def test_plan_over_the_memory_limit_says_over_by_never_negative_headroom(tmp_path, capsys):
    """Llama 3 70B unsharded on one 8-GPU node (tp1, dp8, ZeRO 0): each GPU holds 16 bytes per
    parameter of weights, gradients and Adam states, > 1 TB against 80 GB."""
    problem = tmp_path / "p.yaml"
    problem.write_text("model: llama3-70b\ntraining: {seq_len: 2048, global_batch_size: 16}\n"
                       "cluster: {gpu: h100, num_gpus: 8}\nplan: {tp: 1, pp: 1, zero_stage: 0}\n")
    rc, out, err = main(capsys, "evaluate", str(problem))
    assert rc == 1 and "DOES NOT FIT" in out and "headroom" not in out.split("tightest memory")[1]
    over = float(re.search(r"over by ([0-9.]+) GiB", out).group(1))
    peak, cap = map(float, re.search(r"peak memory ([0-9.]+) / ([0-9.]+) GiB", out).groups())
    assert over == pytest.approx(peak - cap, abs=0.15) and peak > 16 * 70e9 / 2**30
    assert "-" not in re.search(r"tightest memory[^\n]*", out).group(0).split("GiB (")[1]
    assert all(ln.startswith(f"autoshard: infeasible: {problem}: ") for ln in err.splitlines()) and err


def test_per_stage_headroom_in_the_text_report(capsys):
    plan = {"tp": 1, "pp": 2, "zero_stage": 1, "micro_batch_size": 1}
    import autoshard.render as render  # noqa: PLC0415
    from autoshard.cost import evaluate  # noqa: PLC0415

    problem = load_problem(OK)
    est = evaluate(problem, load_plan_dict(plan))
    text = render.estimate_text(problem, est)
    rows = [ln for ln in text.splitlines() if re.match(r"\s+\d+\s+\d+ \(", ln)]
    header = text.split("stages:\n")[1].splitlines()[0]  # the stages' table (rich): its header row
    assert len(rows) == 2 and header.split()[-1] == "headroom" and header.split()[0] == "rank"
    for st, row in zip(est.stages, rows):
        free = est.memory_capacity_gib - st.peak_memory_gib
        assert f"{free:.1f} GiB free, {100 * free / est.memory_capacity_gib:.1f}% headroom" in row, row


def load_plan_dict(d: dict[str, Any]):
    from autoshard.loader import load_plan  # noqa: PLC0415

    return load_plan(d)


def test_batch_help_explains_every_option(capsys):
    rc, out, _ = main(capsys, "batch", "--help")
    assert rc == 0
    flat = " ".join(out.split())
    for opt, default in (("--jobs N", "default 1"), ("--time-limit S", "default 60"), ("--top K", "default 3"),
                         ("--gap G", "default 0.001")):
        assert re.search(re.escape(opt) + r" [A-Za-z(]", flat), opt
        assert default in flat.rsplit(opt, 1)[1][:200], (opt, default)  # the option list, not the usage line


def test_validate_text_ends_with_a_newline(capsys):
    rc, out, _ = main(capsys, "validate")
    assert rc == 0 and out.endswith("\n") and not out.endswith("\n\n")


# ---- issue 15: --headroom GIB ---------------------------------------------------------------------

H100_USABLE_GIB = 79.65  # what the driver reports for an 80 GB H100 (catalog hbm_usable_gib)


def test_headroom_shrinks_the_capacity_and_the_solver_keeps_it(capsys):
    """Without headroom the optimum of ok_problem uses ~66 GiB of the 77.65 GiB an H100 offers after
    the 2 GiB reserve; with 40 GiB kept free the solver must find a plan under 37.65 GiB."""
    rc, out, _ = main(capsys, "solve", OK, "--top", "0", "--json")
    free = json.loads(out)["estimate"]
    assert rc == 0 and free["memory_capacity_gib"] == pytest.approx(H100_USABLE_GIB - 2, abs=0.01)
    assert free["peak_memory_gib"] > H100_USABLE_GIB - 2 - 40  # the headroom binds
    rc, out, _ = main(capsys, "solve", OK, "--top", "0", "--json", "--headroom", "40")
    kept = json.loads(out)["estimate"]
    assert rc == 0 and kept["memory_capacity_gib"] == pytest.approx(H100_USABLE_GIB - 2 - 40, abs=0.01)
    assert kept["peak_memory_gib"] <= H100_USABLE_GIB - 2 - 40 and kept["fits"]
    assert kept["step_time_s"] >= free["step_time_s"]  # a tighter space is never faster


def test_headroom_in_the_problem_file_equals_the_option(tmp_path, capsys):
    doc = yaml.safe_load((ROOT / OK).read_text())
    doc["search"]["headroom_gib"] = 40
    path = tmp_path / "kept.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan = str(BAD / "ok_problem.yaml")
    plan_doc = {"tp": 1, "pp": 1, "zero_stage": 1}
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(plan_doc))
    rc1, a, _ = main(capsys, "evaluate", str(path), "--plan", str(plan_path), "--json")
    rc2, b, _ = main(capsys, "evaluate", plan, "--plan", str(plan_path), "--json", "--headroom", "40")
    ea, eb = json.loads(a), json.loads(b)
    assert ea["memory_capacity_gib"] == eb["memory_capacity_gib"] == pytest.approx(H100_USABLE_GIB - 42, abs=0.01)
    assert rc1 == rc2 == 1 and ea["fits"] is eb["fits"] is False  # 66 GiB do not fit in 37.65


@pytest.mark.parametrize("value,fragment", [
    ("-1", "--headroom: must be a number of GiB >= 0, got -1"),
    ("nan", "--headroom: must be a number of GiB >= 0, got nan"),
    ("78", "--headroom: a headroom of 78 GiB leaves nothing of the 77.7 GiB a h100-sxm offers"),
])
def test_bad_headroom(value, fragment, capsys, tmp_path):
    for argv in (["solve", OK, "--headroom", value], ["evaluate", OK, "--headroom", value],
                 ["batch", OK, "-o", str(tmp_path / "out"), "--headroom", value]):
        rc, out, err = main(capsys, *argv)
        if argv[0] == "batch" and value == "78":  # depends on each problem's GPU: that problem's error record
            rec = json.loads((tmp_path / "out" / "ok_problem.json").read_text())
            assert rc == 2 and fragment in rec["error"]["message"]
            continue
        assert rc == 2 and out == "" and fragment in one_line(err), (argv, err)


def test_batch_headroom_is_a_setting(tmp_path):
    from autoshard.batch import run_batch  # noqa: PLC0415

    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "tiny.yaml").write_text((ROOT / OK).read_text())
    out = tmp_path / "out"
    res = run_batch([str(inp)], str(out), top_k=0, headroom_gib=40)
    rec = json.loads((out / "tiny.json").read_text())
    assert res.exit_code == 0 and rec["settings"]["headroom_gib"] == 40.0
    assert rec["estimate"]["peak_memory_gib"] <= H100_USABLE_GIB - 42
    again = run_batch([str(inp)], str(out), top_k=0)  # another setting: solved again, without headroom
    assert again.problems[0].status == "optimal"
    assert json.loads((out / "tiny.json").read_text())["estimate"]["peak_memory_gib"] > H100_USABLE_GIB - 42


# ---- docs/faults.md: the corpus tables are the program's own output -------------------------------

FAULTS_DOC = ROOT / "docs" / "faults.md"
CORPUS_BEGIN, CORPUS_END = "<!-- corpus tables: generated by `python tests/test_errors.py --write-faults-doc` -->", \
    "<!-- end of corpus tables -->"


def _doc_command(name: str, case: dict[str, Any]) -> list[str]:
    path = str(BAD / name)
    return {"problem": ["solve", path], "evaluate": ["evaluate", path], "plan": ["evaluate", OK, "--plan", path],
            "hf_config": ["solve", OK, "--hf-config", path]}[case["run"]]


def _cell(text: str) -> str:
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _sections() -> list[tuple[str, list[str]]]:
    """(heading, case names) in the order of cases.yaml, from its `# ---- heading ----` comments."""
    out: list[tuple[str, list[str]]] = []
    for line in (ROOT / BAD / "cases.yaml").read_text(encoding="utf-8").splitlines():
        if line.startswith("# ---- "):
            head = line[len("# ---- "):].rstrip("- ").strip()
            out.append((head[:1].upper() + head[1:], []))
        elif line and not line.startswith("#") and ":" in line and out:
            out[-1][1].append(line.split(":", 1)[0].strip())
    return out


def corpus_tables() -> str:
    """The corpus part of docs/faults.md: every case run through the CLI in this process."""
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415

    lines = [CORPUS_BEGIN]
    for head, names in _sections():
        lines += ["", f"### {head}", "", "| Input (`tests/data/bad/`) | Command | Exit | stderr |", "|---|---|---|---|"]
        for name in names:
            argv = _doc_command(name, CASES[name])
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = cli.main(list(argv))
            shown = err.getvalue().strip().replace(str(ROOT), "<repo>")
            cell = "; ".join(_cell(ln) for ln in shown.splitlines())
            lines.append(f"| `{name}` | `autoshard {' '.join(argv)}` | {rc} | {cell} |")
    lines += ["", CORPUS_END]
    return "\n".join(lines)


def test_faults_doc_shows_what_the_program_prints():
    """Every corpus case is in docs/faults.md with the exit code and stderr the CLI gives now."""
    doc = FAULTS_DOC.read_text(encoding="utf-8")
    assert CORPUS_BEGIN in doc and CORPUS_END in doc
    shown = doc[doc.index(CORPUS_BEGIN):doc.index(CORPUS_END) + len(CORPUS_END)]
    want = corpus_tables()
    if shown != want:
        diff = [f"doc:  {a}\nnow:  {b}" for a, b in zip(shown.splitlines(), want.splitlines()) if a != b][:3]
        pytest.fail("docs/faults.md is stale: run `python tests/test_errors.py --write-faults-doc`\n" + "\n".join(diff)
                    + ("" if diff else f"\n(lengths {len(shown.splitlines())} vs {len(want.splitlines())} lines)"))


if __name__ == "__main__":  # python tests/test_errors.py --write-faults-doc (from the repository root)
    if sys.argv[1:] == ["--write-faults-doc"]:
        os.chdir(ROOT)
        text = FAULTS_DOC.read_text(encoding="utf-8")
        start, end = text.index(CORPUS_BEGIN), text.index(CORPUS_END) + len(CORPUS_END)
        FAULTS_DOC.write_text(text[:start] + corpus_tables() + text[end:], encoding="utf-8")
        print(f"wrote {FAULTS_DOC}")


def test_output_to_dev_stdout_redirected_to_a_file_keeps_everything(tmp_path):
    """`solve -o /dev/stdout > file`: the report goes through the shell's file, next to the text
    summary; renaming a temporary file over the file would have cut the summary off."""
    dest = tmp_path / "all.txt"
    with open(dest, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", "autoshard.cli", "solve", OK, "-o", "/dev/stdout", "--top", "0"],
                              cwd=ROOT, stdout=fh, stderr=subprocess.PIPE, text=True, timeout=SUBPROCESS_TIMEOUT_S,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    text = dest.read_text()
    assert proc.returncode == 0, proc.stderr
    assert "## Plan" in text and "solver: OPTIMAL" in text, text[:500]
    assert [p.name for p in tmp_path.iterdir()] == ["all.txt"]


def test_infeasible_under_a_headroom_suggests_less_headroom_not_the_same_gpu(capsys):
    """With 66 GiB kept free, ok_problem's leanest plan needs 22.9 GiB of the 11.65 left: the fixes
    are a smaller headroom (at most 77.65 - 22.9 = 54.8 GiB) or a GPU with more HBM than an H100,
    never the H100 itself (it was listed as 'a larger-HBM GPU'). (With 60 GiB free a plan with the
    optimizer offloaded to the CPU fits, which the solver plans where nothing fits without it.)"""
    from autoshard.catalog import get_gpu  # noqa: PLC0415

    rc, out, err = main(capsys, "solve", OK, "--headroom", "66", "--top", "0")
    assert rc == 1 and out == ""
    need = float(re.search(r"needs ([0-9.]+) GiB of ([0-9.]+) GiB usable", err).group(1))
    limit = float(re.search(r"--headroom ([0-9.]+) or less; 66 GiB now", err).group(1))
    assert limit == pytest.approx(H100_USABLE_GIB - 2 - need, abs=0.06)
    bigger = re.search(r"a larger-HBM GPU \(([^)]*)\)", err).group(1).split(", ")
    assert "h100-sxm" not in bigger and all(get_gpu(g).hbm_gib > H100_USABLE_GIB for g in bigger)


def test_huge_hf_config_is_refused_before_reading(tmp_path, capsys):
    big = tmp_path / "config.json"
    with open(big, "wb") as fh:
        fh.truncate(20 * 2**30)
    t0 = time.perf_counter()
    rc, _, err = main(capsys, "solve", OK, "--hf-config", str(big))
    assert rc == 2 and "config.json is 21,474,836,480 bytes, larger than the 16,777,216 allowed" in one_line(err)
    assert time.perf_counter() - t0 < 2


def test_calibrate_to_a_pipe_and_a_255_byte_file_name(tmp_path):
    """The fitted overlay can go to stdout (`-o /dev/stdout | ...`): the 'after' errors are measured
    on a scratch copy, not by reading -o back; and a 255-byte output name fits (the temporary
    file's name is shortened)."""
    from autoshard.fileio import atomic_write  # noqa: PLC0415
    from autoshard.validate import default_runs_path  # noqa: PLC0415

    long = tmp_path / ("x" * 250 + ".yaml")
    atomic_write(long, "gpus: {}\n")
    assert long.read_text() == "gpus: {}\n" and len(list(tmp_path.iterdir())) == 1
    rows = [r for r in json.loads(Path(default_runs_path()).read_text()) if r["id"].startswith("narayanan")][:2]
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps(rows))
    proc = subprocess.run(f"{sys.executable} -m autoshard.cli calibrate {runs} -o /dev/stdout | cat", shell=True,
                          cwd=ROOT, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    overlay = proc.stdout.split("calibrated on")[0]
    doc = yaml.safe_load(overlay)
    assert "a100-sxm-80gb" in doc["gpus"] and "median |error|" in overlay


def test_documented_time_limit_defaults_are_the_programs():
    """docs/faults.md said `whatif` 30 s while `whatif --help` and the code used 10 s."""
    from autoshard.whatif import DEFAULT_TIME_LIMIT_S  # noqa: PLC0415

    parser = cli.cli_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices  # noqa: SLF001
    solve_s, batch_s = sub["solve"].get_default("time_limit"), sub["batch"].get_default("time_limit")
    doc = " ".join(FAULTS_DOC.read_text(encoding="utf-8").split())
    assert (f"`--time-limit S` (default {solve_s:g} s for `solve` and for each problem of `batch`; `whatif`: the "
            f"study's `time_limit_s`, else {DEFAULT_TIME_LIMIT_S:g} s per option") in doc
    assert solve_s == batch_s
    assert f"else {DEFAULT_TIME_LIMIT_S:g} s" in " ".join(sub["whatif"].format_help().split())


def test_a_study_whose_every_option_hits_a_bug_exits_3(tmp_path, capsys, monkeypatch):
    """Every option of a what-if study failing for a reason that is not the input (here a bug in the
    solve) exits 3 with one line, as any internal error; results.json keeps the rows. Options that
    fail as bad input keep exit 2."""
    import autoshard.whatif.runner as runner

    def bug(*a, **k):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(runner, "solve_option", bug)
    out = tmp_path / "out"
    rc, stdout, err = main(capsys, "whatif", "problems/studies/cloud-vs-buy.yaml", "-o", str(out), "--jobs", "1",
                           "--quiet")
    line = one_line(err)
    assert rc == 3 and stdout == ""
    assert line.startswith("autoshard: error: every option failed to solve") and "ZeroDivisionError" in line
    assert "not the input: a bug in autoshard" in line
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert rows and all(r["status"] == "error" for r in rows)

    def bad(*a, **k):
        raise InputError("training.seq_len: must be positive")

    monkeypatch.setattr(runner, "solve_option", bad)
    rc, _, err = main(capsys, "whatif", "problems/studies/cloud-vs-buy.yaml", "-o", str(tmp_path / "out2"),
                      "--jobs", "1", "--quiet")
    assert rc == 2 and "not the input" not in one_line(err)
