"""`autoshard batch` and the renderers: discovery, records, incremental skips, determinism,
output-directory checks, symlink loops and interruption."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from autoshard import batch as batch_mod
from autoshard.batch import ProgressBar, find_problems, run_batch, summary_table
from autoshard.cost import evaluate
from autoshard.errors import InputError
from autoshard.loader import load_problem
from autoshard.render import (
    error_record,
    estimate_text,
    input_hash,
    record_exit_code,
    solution_markdown,
    solution_record,
    solution_text,
    strip_timing,
)
from autoshard.spec import Plan

DATA = Path(__file__).parent / "data" / "batch"
REPO = Path(__file__).resolve().parents[1]
TINY = {"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch_size": 16},
        "cluster": {"gpu": "h100", "num_gpus": 8},
        "search": {"tp": [1, 2], "pp": [1, 2], "micro_batch_size": [1], "zero_stage": [1]}}
NAMES = {"good_a", "good_b", "malformed", "infeasible"}


def copy_inputs(dst: Path) -> Path:
    shutil.copytree(DATA, dst)
    return dst


def read_summary(out: Path) -> list[dict[str, str]]:
    with open(out / "summary.csv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def mtimes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "summary.csv"}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One jobs=1 batch over the fixture directory, shared by the read-only tests."""
    base = tmp_path_factory.mktemp("batch")
    inp = copy_inputs(base / "in")
    out = base / "out"
    calls: list[tuple[int, int, str, str]] = []
    result = run_batch([str(inp)], str(out), jobs=1, time_limit_s=30, progress=lambda *a: calls.append(a))
    return inp, out, result, calls


# ---- the batch ----------------------------------------------------------------------------------


def test_outputs_records_and_exit_code(first_run):
    inp, out, result, calls = first_run
    assert {p.name for p in result.problems} == NAMES
    for n in NAMES:  # one JSON and one Markdown file per problem, errors included
        assert (out / f"{n}.json").is_file() and (out / f"{n}.md").is_file()
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*"))
    by = {p.name: p for p in result.problems}
    assert by["good_a"].status == "optimal" and by["good_b"].status == "optimal"
    assert by["infeasible"].status == "infeasible" and by["infeasible"].exit_code == 1
    assert by["malformed"].status == "error" and by["malformed"].exit_code == 2
    assert result.exit_code == 2  # the largest

    good = json.loads((out / "good_a.json").read_text())
    assert good["status"] == "optimal" and good["input_sha256"] and good["autoshard_version"]
    assert good["problem"]["path"] == str(inp / "good_a.yaml")
    assert good["problem"]["gpu"] == "h100-sxm" and good["problem"]["num_gpus"] == 8
    assert good["plan"] == good["estimate"]["plan"] and good["estimate"]["fits"]
    assert good["solver"]["status"] == "OPTIMAL" and "solve_time_s" in good["solver"]
    assert good["settings"] == {"time_limit_s": 30.0, "top_k": 3, "gap_limit": 0.001}

    bad = json.loads((out / "malformed.json").read_text())
    assert bad["error"]["kind"] == "input" and bad["error"]["exit_code"] == 2
    assert "malformed.yaml" in bad["error"]["message"] and "YAML syntax error at line" in bad["error"]["message"]
    inf = json.loads((out / "infeasible.json").read_text())
    assert inf["status"] == "infeasible" and inf["error"]["kind"] == "infeasible"
    assert inf["error"]["suggestions"] and "GiB" in inf["error"]["message"]
    assert inf["problem"]["model"] == "llama3-405b"

    # The what-if study under studies/ is not a problem: skipped, with a note.
    assert any("tiny-study.yaml" in n and "not a problem" in n for n in result.notes)
    assert not (out / "tiny-study.json").exists()

    # Progress: a start call, then one per problem with its status.
    assert calls[0] == (0, 4, "", "")
    assert sorted(c[2] for c in calls[1:]) == sorted(NAMES) and [c[0] for c in calls[1:]] == [1, 2, 3, 4]

    rows = read_summary(out)
    assert [r["name"] for r in rows] == sorted(NAMES)
    assert list(rows[0]) == list(batch_mod.SUMMARY_COLUMNS)
    r = {x["name"]: x for x in rows}
    assert r["good_a"]["status"] == "optimal" and float(r["good_a"]["step_time_s"]) == good["estimate"]["step_time_s"]
    assert r["good_a"]["gpu"] == "h100-sxm" and r["good_a"]["num_gpus"] == "8" and r["good_a"]["model"] == "llama3-8b"
    assert r["good_a"]["plan"] == good["plan_summary"] and float(r["good_a"]["solve_time_s"]) > 0
    assert 0 < float(r["good_b"]["mfu"]) < 1 and float(r["good_b"]["peak_memory_gib"]) > 0
    assert r["infeasible"]["status"] == "infeasible" and r["infeasible"]["step_time_s"] == ""
    assert r["malformed"]["status"] == "error" and "YAML syntax error" in r["malformed"]["message"]

    table = summary_table(result)
    assert "good_a" in table and "exit code 2" in table and "not a problem" in table


def test_markdown_report(first_run):
    _, out, _, _ = first_run
    md = (out / "good_a.md").read_text()
    for section in ("# good-a: llama3-8b on 8x h100-sxm", "**Plan:** `tp", "## Plan", "| tp |", "## Performance",
                    "| MFU |", "| HFU |", "peak memory", "## Where the step time goes", "| compute |", "% of step",
                    "## Pipeline stages", "in-flight", "| weights | grads | optimizer | activations |",
                    "## Binding constraint", "headroom", "## Alternatives", "## Solver", "| CP-SAT solves |",
                    "| solve time |"):
        assert section in md, section
    assert "solve time" not in strip_timing(md) and strip_timing(md).count("\n") == md.count("\n") - 1
    inf = (out / "infeasible.md").read_text()
    assert "**Infeasible** (exit code 1)" in inf and "- more GPUs" in inf


def test_rerun_skips_unchanged_then_force_resolves(first_run, tmp_path):
    inp = copy_inputs(tmp_path / "in")
    out = tmp_path / "out"
    shutil.copytree(first_run[1], out)  # outputs of an identical input tree... at another path
    # Paths differ, so the records' hashes still match (the hash is of content, not of the path).
    before = mtimes(out)
    again = run_batch([str(inp)], str(out), jobs=1)
    assert {p.name: p.status for p in again.problems} == dict.fromkeys(NAMES, "skipped-unchanged")
    assert {p.name: p.result for p in again.problems} == {
        "good_a": "optimal", "good_b": "optimal", "infeasible": "infeasible", "malformed": "error"}
    assert again.exit_code == 2  # the outcomes on file still include bad input
    assert mtimes(out) == before
    summary = read_summary(out)
    assert [r["run"] for r in summary] == ["skipped-unchanged"] * 4
    assert [r["status"] for r in summary] == ["optimal", "optimal", "infeasible", "error"]  # sorted by name

    # Editing one file re-solves that one only.
    (inp / "good_a.yaml").write_text((inp / "good_a.yaml").read_text() + "\n# edited\n")
    edited = run_batch([str(inp)], str(out), jobs=1)
    st = {p.name: p.status for p in edited.problems}
    assert st.pop("good_a") == "optimal" and set(st.values()) == {"skipped-unchanged"}
    after_edit = mtimes(out)
    assert after_edit["good_a.json"] != before["good_a.json"]
    assert after_edit["good_b.json"] == before["good_b.json"]

    # Other solver settings are another input: everything is solved again.
    other = run_batch([str(inp)], str(out), jobs=1, top_k=2)
    assert "skipped-unchanged" not in {p.status for p in other.problems}
    # force re-solves even when nothing changed.
    exact = run_batch([str(inp)], str(out), jobs=1, top_k=2, gap_limit=0.0)  # so is the gap limit
    assert "skipped-unchanged" not in {p.status for p in exact.problems}
    assert json.loads((out / "good_a.json").read_text())["settings"]["gap_limit"] == 0.0
    forced = run_batch([str(inp)], str(out), jobs=1, top_k=2, gap_limit=0.0, force=True)
    assert {p.name: p.status for p in forced.problems} == {
        "good_a": "optimal", "good_b": "optimal", "infeasible": "infeasible", "malformed": "error"}
    assert all(mtimes(out)[k] > after_edit[k] for k in after_edit)


def test_summary_has_no_repeated_column(first_run):
    """Issue 15: `status` and `result` held the same word on every solved row."""
    _, out, _, _ = first_run
    rows = read_summary(out)
    for col in batch_mod.SUMMARY_COLUMNS:
        for other in batch_mod.SUMMARY_COLUMNS:
            if col < other:
                assert [r[col] for r in rows] != [r[other] for r in rows], (col, other)
    assert {r["run"] for r in rows} == {"solved"}


def test_edited_record_is_solved_again(first_run, tmp_path):
    """Issue 15 (14): a valid record edited by hand (tp=999) is not trusted by the incremental skip."""
    inp = copy_inputs(tmp_path / "in")
    out = tmp_path / "out"
    shutil.copytree(first_run[1], out)
    rec = json.loads((out / "good_a.json").read_text())
    assert batch_mod.record_intact(rec)
    rec["plan"]["tp"] = 999
    rec["plan_summary"] = rec["plan_summary"].replace("tp", "tp999 was-tp", 1)
    (out / "good_a.json").write_text(json.dumps(rec, indent=2))  # valid JSON, same input_sha256
    again = run_batch([str(inp)], str(out), jobs=1)
    st = {p.name: p.status for p in again.problems}
    assert st.pop("good_a") == "optimal" and set(st.values()) == {"skipped-unchanged"}
    fixed = json.loads((out / "good_a.json").read_text())
    assert fixed["plan"]["tp"] != 999 and batch_mod.record_intact(fixed)
    assert fixed["plan"] == json.loads((first_run[1] / "good_a.json").read_text())["plan"]


def test_deterministic_across_jobs_and_input_order(first_run, tmp_path):
    inp, out1, _, _ = first_run
    out2 = tmp_path / "out2"
    files = sorted((str(p) for p in inp.iterdir() if p.is_file()), reverse=True)  # explicit files, reversed
    res = run_batch(files, str(out2), jobs=2)
    assert {p.name for p in res.problems} == NAMES and res.exit_code == 2
    for n in sorted(NAMES):
        a = json.loads((out1 / f"{n}.json").read_text())
        b = json.loads((out2 / f"{n}.json").read_text())
        assert strip_timing(a) == strip_timing(b), n
        assert strip_timing((out1 / f"{n}.md").read_text()) == strip_timing((out2 / f"{n}.md").read_text()), n
    strip = lambda rows: [{k: v for k, v in r.items() if k != "solve_time_s"} for r in rows]  # noqa: E731
    assert strip(read_summary(out1)) == strip(read_summary(out2))


def test_unwritable_output_dir_fails_before_solving(tmp_path, monkeypatch):
    def boom(task):  # pragma: no cover - must not be reached
        raise AssertionError("solved before checking the output directory")

    monkeypatch.setattr(batch_mod, "solve_task", boom)
    (tmp_path / "file.txt").write_text("not a directory\n")
    with pytest.raises(InputError) as ei:
        run_batch([str(DATA)], str(tmp_path / "file.txt" / "out"))
    assert "file.txt" in str(ei.value) and "output directory" in str(ei.value)
    with pytest.raises(InputError, match="not a directory"):
        run_batch([str(DATA)], str(tmp_path / "file.txt"))


def test_bad_arguments_and_no_problems(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no problem files found"):
        run_batch([str(tmp_path / "empty")], str(tmp_path / "out"))
    with pytest.raises(InputError, match="time limit"):
        run_batch([str(DATA)], str(tmp_path / "out"), time_limit_s=0)
    with pytest.raises(InputError, match="jobs"):
        run_batch([str(DATA)], str(tmp_path / "out"), jobs=-1)


def test_symlink_loops_are_reported_not_walked(tmp_path):
    inp = tmp_path / "in"
    (inp / "sub").mkdir(parents=True)
    (inp / "sub" / "tiny.json").write_text(json.dumps(TINY))
    os.symlink(inp, inp / "sub" / "back")  # a directory link to an ancestor
    os.symlink("self.yaml", inp / "self.yaml")  # a link to itself
    os.symlink(inp / "sub", inp / "again")  # a second way into sub/: searched once
    found, notes = find_problems([str(inp)])
    assert sorted((n, e is not None) for n, _, e in found) == [("back", True), ("self", True), ("tiny", False)]
    assert [p for _, p, _ in found] == sorted(p for _, p, _ in found)
    assert any("already searched" in n for n in notes)  # sub/ is reached through again/ first

    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("batch hung")))
    signal.alarm(60)
    try:
        res = run_batch([str(inp)], str(tmp_path / "out"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    st = {p.name: p.status for p in res.problems}
    assert st == {"back": "error", "self": "error", "tiny": "optimal"} and res.exit_code == 2
    loop = json.loads((tmp_path / "out" / "back.json").read_text())
    assert loop["error"]["kind"] == "input" and "symbolic link loop" in loop["error"]["message"]
    assert "symbolic link loop" in json.loads((tmp_path / "out" / "self.json").read_text())["error"]["message"]


def test_names_are_unique_and_order_independent(tmp_path):
    for rel in ("a/x.yaml", "b/x.yaml", "b/c/x.yaml", "y.yaml", "y.json", "solo.yml"):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(TINY))
    (tmp_path / "notes.yaml").write_text("just: a note\n")
    (tmp_path / ".hidden.yaml").write_text(json.dumps(TINY))
    found, notes = find_problems([str(tmp_path)])
    names = {os.path.relpath(p, tmp_path): n for n, p, _ in found}
    assert names == {"a/x.yaml": "a__x", "b/x.yaml": "b__x", "b/c/x.yaml": "b__c__x", "y.json": "y_json",
                     "y.yaml": "y_yaml", "solo.yml": "solo"}
    assert any("notes.yaml" in n for n in notes)
    # Same names whatever the order or the form of the inputs (files, dirs, globs).
    rev = [str(tmp_path / r) for r in sorted(names, reverse=True)]
    assert {os.path.relpath(p, tmp_path): n for n, p, _ in find_problems(rev)[0]} == names
    globbed = find_problems([str(tmp_path / "**" / "*.y*ml"), str(tmp_path / "y.json")])[0]
    assert {os.path.relpath(p, tmp_path): n for n, p, _ in globbed} == names
    # The output directory is never searched, even inside an input directory.
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x.json").write_text(json.dumps(TINY))
    found, notes = find_problems([str(tmp_path)], exclude=tmp_path / "out")
    assert len(found) == 6 and any("output directory" in n for n in notes)
    # A missing input is an error record, not a crash.
    missing = find_problems([str(tmp_path / "nope.yaml")])[0]
    assert missing[0][0] == "nope" and "no such file" in missing[0][2]


# ---- interruption -------------------------------------------------------------------------------

SCRIPT = textwrap.dedent("""
    import sys
    from autoshard.batch import run_batch

    def progress(done, total, name, status):
        if name:
            print("DONE", name, status, flush=True)

    run_batch(sys.argv[1:-2], sys.argv[-2], jobs=int(sys.argv[-1]), time_limit_s=30, progress=progress)
    print("COMPLETED", flush=True)
""")


def slow_problems(d: Path, n: int = 4) -> list[str]:
    """Problems of several seconds each: tests/data/hard_proof_moe.yaml (DeepSeek-V3 on 2,048 H800, a
    small declared space whose proof takes 7 s on an idle 2-core machine) at n global batch sizes. The
    Mixtral problems this used to take now prove in under a second and the batch could finish before the
    signal arrived."""
    base = yaml.safe_load((REPO / "tests" / "data" / "hard_proof_moe.yaml").read_text())
    d.mkdir(parents=True)
    out = []
    for i in range(n):
        p = dict(base, name=f"slow{i}", training=dict(base["training"], global_batch_size=15360 - 1024 * i))
        path = d / f"slow{i}.json"
        path.write_text(json.dumps(p))
        out.append(str(path))
    return out


def interrupt(tmp_path: Path, jobs: int, sig: int) -> tuple[int, Path, str]:
    files = slow_problems(tmp_path / "in")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # (SIGINT at its default in the child: a test run started in the background, `pytest ... &` without job
    # control, inherits SIGINT ignored, as POSIX has it, and the batch then rightly ignores Ctrl-C)
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, *files, str(out), str(jobs)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = proc.stdout.readline()  # blocks until the first problem finished (its files written)
        assert first.startswith("DONE"), first + proc.stderr.read()
        proc.send_signal(sig)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "COMPLETED" not in rest, "the batch finished before the signal: make the problems slower"
    return proc.returncode, out, err


def check_interrupted_outputs(out: Path) -> None:
    assert not [p.name for p in out.rglob("*") if p.name.endswith(".tmp")]
    jsons = sorted(out.glob("*.json"))
    assert 1 <= len(jsons) < 4
    for p in jsons:
        assert json.loads(p.read_text())["status"] == "optimal"
    rows = read_summary(out)
    assert 1 <= len(rows) < 4 and {r["name"] for r in rows} <= {p.stem for p in jsons}
    assert all(r["status"] == "optimal" for r in rows)


def test_sigint_keeps_finished_outputs(tmp_path):
    rc, out, err = interrupt(tmp_path, jobs=1, sig=signal.SIGINT)
    assert rc != 0 and "KeyboardInterrupt" in err
    check_interrupted_outputs(out)


def test_sigterm_stops_parallel_batch(tmp_path):
    rc, out, err = interrupt(tmp_path, jobs=2, sig=signal.SIGTERM)
    assert rc != 0 and "KeyboardInterrupt" in err  # SIGTERM became KeyboardInterrupt: the summary was written
    check_interrupted_outputs(out)


def test_keyboard_interrupt_in_process_writes_summary(tmp_path, monkeypatch):
    real = batch_mod.solve_task
    seen = []

    def solve_then_interrupt(task):
        if seen:
            raise KeyboardInterrupt
        seen.append(task.name)
        return real(task)

    monkeypatch.setattr(batch_mod, "solve_task", solve_then_interrupt)
    inp = copy_inputs(tmp_path / "in")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as ei:
        run_batch([str(inp)], str(tmp_path / "out"))
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is restored
    partial = ei.value.batch_result
    assert partial.interrupted and partial.total == 4 and [p.name for p in partial.problems] == seen
    assert [r["name"] for r in read_summary(tmp_path / "out")] == seen
    assert "interrupted" in summary_table(partial)


# ---- progress bar -------------------------------------------------------------------------------


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_lines_and_tty():
    plain = io.StringIO()
    bar = ProgressBar(plain)
    bar(0, 2, "", "")
    bar(1, 2, "a", "optimal")
    bar(2, 2, "b", "infeasible")
    assert plain.getvalue() == "[1/2] a: optimal\n[2/2] b: infeasible\n"
    tty = FakeTTY()
    bar = ProgressBar(tty)
    bar(0, 2, "", "")
    bar(1, 2, "a", "optimal")
    assert tty.getvalue().count("\r") == 2 and "\n" not in tty.getvalue() and "1/2" in tty.getvalue()
    bar.close()
    assert tty.getvalue().endswith("\n")
    assert bar.counts == {"optimal": 1}


# ---- renderers ----------------------------------------------------------------------------------


def test_records_and_text_renderers(tmp_path):
    from autoshard.solver import solve

    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    problem = load_problem(path)
    sol = solve(problem, time_limit_s=30, top_k=2)
    rec = solution_record(str(path), problem, sol)
    assert rec["input_sha256"] == input_hash(path.read_bytes())
    assert rec["problem"] == {"name": "tiny", "path": str(path), "model": "llama3-8b", "gpu": "h100-sxm",
                              "num_gpus": 8}
    assert record_exit_code(rec) == 0 and "solve_time_s" not in strip_timing(rec)["solver"]
    assert "solve_time_s" in rec["solver"]  # strip_timing copies
    json.dumps(rec, allow_nan=False)
    md = solution_markdown(problem, sol)
    assert md.endswith("\n") and "## Solver" in md
    text = estimate_text(problem, sol.estimate)
    assert text.endswith("\n") and "MFU" in text and "peak memory" in text and "bottleneck" in text
    assert "solver: OPTIMAL" in solution_text(problem, sol)
    # A pipeline-parallel estimate lists its stages; an invalid plan prints its reasons.
    pp = evaluate(problem, Plan(tp=1, pp=2, recompute="full"))
    assert "stages:" in estimate_text(problem, pp)
    bad = evaluate(problem, Plan(tp=3))
    out = estimate_text(problem, bad)
    assert "INVALID PLAN" in out and bad.reasons[0] in out

    inf = error_record("x.yaml", "infeasible", "too big", ["more GPUs"])
    assert record_exit_code(inf) == 1 and inf["status"] == "infeasible" and inf["error"]["suggestions"] == ["more GPUs"]
    assert record_exit_code(error_record("x.yaml", "input", "bad")) == 2
    with pytest.raises(ValueError):
        error_record("x.yaml", "oops", "bad")
    assert input_hash(b"a", {"top_k": 1}) != input_hash(b"a", {"top_k": 2}) != input_hash(b"b", {"top_k": 2})


def test_a_huge_file_in_a_batch_is_an_error_record_not_out_of_memory(tmp_path):
    """Issue 15 (4): the incremental-skip hash read the whole file: a 20 GiB sparse problem file in
    a batch directory exhausted memory. Now its size is checked first; the other problems solve."""
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "tiny.json").write_text(json.dumps(TINY))
    with open(inp / "huge.yaml", "wb") as fh:
        fh.truncate(20 * 2**30)
    res = run_batch([str(inp)], str(tmp_path / "out"), top_k=0)
    st = {p.name: p.status for p in res.problems}
    assert st == {"tiny": "optimal", "huge": "error"} and res.exit_code == 2
    rec = json.loads((tmp_path / "out" / "huge.json").read_text())
    assert "21,474,836,480 bytes, larger than the 1,048,576 allowed" in rec["error"]["message"]


def test_a_bug_in_one_problem_is_an_internal_error_record_and_exit_3(tmp_path, monkeypatch):
    """An exception that is neither bad input nor infeasibility is recorded as `internal` (exit 3,
    the batch's largest), and the other problems still solve; an integer overflow from a too-large
    input number is bad input (2), as on the command line."""
    import autoshard.solver as solver

    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "tiny.json").write_text(json.dumps(TINY))
    (inp / "other.json").write_text(json.dumps({**TINY, "training": {**TINY["training"], "seq_len": 1024}}))
    real = solver.solve

    def solve(problem, *a, **k):
        if problem.training.seq_len == 1024:
            raise ZeroDivisionError("float division by zero")
        return real(problem, *a, **k)

    monkeypatch.setattr(solver, "solve", solve)
    res = run_batch([str(inp)], str(tmp_path / "out"), top_k=0)
    st = {p.name: p.status for p in res.problems}
    assert st == {"tiny": "optimal", "other": "error"} and res.exit_code == 3
    rec = json.loads((tmp_path / "out" / "other.json").read_text())
    assert rec["error"]["kind"] == "internal" and rec["error"]["message"] == "ZeroDivisionError: float division by zero"

    def overflow(problem, *a, **k):
        raise RuntimeError("CP-SAT rejected the stage model: Possible integer overflow in constraint")

    monkeypatch.setattr(solver, "solve", overflow)
    res = run_batch([str(inp)], str(tmp_path / "out2"), top_k=0)
    assert res.exit_code == 2 and {p.status for p in res.problems} == {"error"}
    assert json.loads((tmp_path / "out2" / "tiny.json").read_text())["error"]["kind"] == "input"
