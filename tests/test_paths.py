"""Paths inside problem and study files (`model.hf_config`, `cluster.catalog`, a study's
`workloads[].model.hf_config` and `options[].catalog`) are read relative to the folder of the
file that names them, whatever the working directory; absolute paths are kept; a problem
given as a dict (no file) reads them relative to the working directory.

Every test runs from a working directory (`elsewhere`) that is not the files' folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli_helpers import one_line, run_cli
from autoshard.batch import input_key, run_batch
from autoshard.catalog import get_gpu
from autoshard.errors import InputError
from autoshard.hf import model_from_hf_config
from autoshard.loader import load_problem
from autoshard.whatif import load_study

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "tests" / "data" / "hf" / "Meta-Llama-3-8B.json"
# A calibrated catalog overlay (the shape `autoshard calibrate` writes) with factors no built-in GPU has.
OVERLAY = {"gpus": {"h100": {"efficiency": {"matmul": {"bf16": 0.5}, "hbm": 0.7, "scaleup": 0.6, "scaleout": 0.6}}}}
PROBLEM = {"model": {"hf_config": "config.json"},
           "training": {"seq_len": 2048, "global_batch_size": 16},
           "cluster": {"gpu": "h100", "num_gpus": 8, "catalog": "overlay.yaml"},
           "search": {"tp": [1, 2], "pp": [1, 2], "micro_batch_size": [1], "zero_stage": [1]}}
STUDY = {"name": "paths",
         "workloads": [{"model": {"hf_config": "config.json"}, "training": {"seq_len": 2048, "global_batch_size": 16},
                        "tokens": 1.0e9, "search": {"tp": [1, 2], "pp": 1, "cp": 1}}],
         "options": [{"gpu": "h100-sxm", "num_gpus": 8, "catalog": "overlay.yaml"}],
         "sensitivity": "off",
         "time_limit_s": 10.0}


def write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def proj(tmp_path, monkeypatch) -> Path:
    """tmp/proj holding problem.yaml, study.yaml and the config.json and overlay.yaml they name;
    the working directory is tmp/elsewhere."""
    d = tmp_path / "proj"
    d.mkdir()
    shutil.copyfile(HF, d / "config.json")
    write(d / "overlay.yaml", OVERLAY)
    write(d / "problem.yaml", PROBLEM)
    write(d / "study.yaml", STUDY)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return d


def real(p: Path) -> str:
    return os.path.realpath(p)


main = run_cli


# ---- load_problem --------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["absolute", "relative"])
def test_problem_file_paths_are_relative_to_the_file(proj, spelling):
    path = proj / "problem.yaml" if spelling == "absolute" else Path("..") / "proj" / "problem.yaml"
    problem = load_problem(path)
    ref = model_from_hf_config(HF)
    assert problem.model.hidden_size == ref.hidden_size and problem.model.num_hidden_layers == ref.num_hidden_layers
    assert problem.model.source == f"hf config.json: {real(proj / 'config.json')}"
    assert problem.cluster.catalog == real(proj / "overlay.yaml")  # absolute: later use does not depend on the cwd
    assert get_gpu("h100", problem.cluster.catalog).efficiency.model_dump() == OVERLAY["gpus"]["h100"]["efficiency"]


def test_absolute_paths_are_kept(proj, tmp_path):
    other = tmp_path / "shared"
    other.mkdir()
    shutil.copyfile(HF, other / "llama.json")
    write(other / "cal.yaml", OVERLAY)
    doc = {**PROBLEM, "model": {"hf_config": str(other / "llama.json")},
           "cluster": {**PROBLEM["cluster"], "catalog": str(other / "cal.yaml")}}
    problem = load_problem(write(proj / "abs.yaml", doc))
    assert problem.cluster.catalog == str(other / "cal.yaml")
    assert problem.model.source == f"hf config.json: {other / 'llama.json'}"


def test_a_linked_problem_file_reads_paths_next_to_its_target(proj, tmp_path):
    link = tmp_path / "elsewhere" / "link.yaml"
    link.symlink_to(proj / "problem.yaml")
    assert load_problem("link.yaml").cluster.catalog == real(proj / "overlay.yaml")


def test_a_dict_problem_reads_paths_relative_to_the_working_directory(proj, monkeypatch):
    with pytest.raises(InputError, match="calibrated catalog 'overlay.yaml' not found"):
        load_problem({**PROBLEM, "model": "llama3-8b"})
    with pytest.raises(InputError, match=r"^model\.hf_config: config\.json: no such file"):
        load_problem(PROBLEM)
    monkeypatch.chdir(proj)
    problem = load_problem(PROBLEM)
    assert problem.cluster.catalog == "overlay.yaml"
    assert problem.model.hidden_size == model_from_hf_config(HF).hidden_size


def test_missing_relative_files_name_the_problem_the_field_and_the_resolved_path(proj):
    path = str(proj / "missing.yaml")
    write(Path(path), {**PROBLEM, "model": {"hf_config": "nope/config.json"}})
    with pytest.raises(InputError) as exc:
        load_problem(path)
    assert str(exc.value) == (f"{path}: model.hf_config: {real(proj)}/nope/config.json: "
                              "no such file (expected a Hugging Face config.json)")
    write(Path(path), {**PROBLEM, "cluster": {**PROBLEM["cluster"], "catalog": "cal/nope.yaml"}})
    with pytest.raises(InputError) as exc:
        load_problem(path)
    assert str(exc.value) == f"{path}: cluster.catalog: calibrated catalog '{real(proj)}/cal/nope.yaml' not found"


def test_errors_inside_a_named_file_name_both_files(proj):
    (proj / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}), encoding="utf-8")
    with pytest.raises(InputError) as exc:
        load_problem(proj / "problem.yaml")
    assert str(exc.value).startswith(f"{proj / 'problem.yaml'}: model.hf_config: {real(proj / 'config.json')}: "
                                     "model_type: not a decoder-only language model")
    shutil.copyfile(HF, proj / "config.json")
    write(proj / "overlay.yaml", {"gpus": {"h100": {"efficiency": {**OVERLAY["gpus"]["h100"]["efficiency"], "hbm": 2}}}})
    with pytest.raises(InputError) as exc:
        load_problem(proj / "problem.yaml")
    assert str(exc.value).startswith(f"{proj / 'problem.yaml'}: cluster.catalog: {real(proj / 'overlay.yaml')}: "
                                     "gpus.h100.efficiency.hbm: malformed calibrated catalog")


# ---- the command line ------------------------------------------------------------------------------


def test_cli_solve_from_another_directory(proj, capsys):
    rc, out, err = main(capsys, "solve", str(proj / "problem.yaml"), "--json")
    assert rc == 0, err
    assert json.loads(out)["status"] == "optimal"


def test_cli_missing_relative_file_is_one_line_exit_2(proj, capsys):
    path = str(Path("..") / "proj" / "bad.yaml")
    write(Path(path), {**PROBLEM, "cluster": {**PROBLEM["cluster"], "catalog": "no-such.yaml"}})
    rc, out, err = main(capsys, "solve", path, "-o", "sol.json")
    assert rc == 2 and out == ""
    assert one_line(err) == (f"autoshard: error: {path}: cluster.catalog: calibrated catalog "
                             f"'{real(proj)}/no-such.yaml' not found")
    write(Path(path), {**PROBLEM, "model": {"hf_config": "no-such.json"}})
    rc, out, err = main(capsys, "evaluate", path, "--plan", str(proj / "problem.yaml"))
    assert rc == 2 and out == ""
    assert one_line(err).startswith(f"autoshard: error: {path}: model.hf_config: {real(proj)}/no-such.json: no such file")
    assert not Path("sol.json").exists()


def test_cli_in_a_real_process(proj, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "autoshard.cli"]
    ok = subprocess.run([*cmd, "solve", "../proj/problem.yaml", "--json"], cwd=tmp_path / "elsewhere",
                        capture_output=True, text=True, timeout=120, env=env)
    assert ok.returncode == 0, ok.stderr
    write(proj / "bad.yaml", {**PROBLEM, "model": {"hf_config": "missing.json"}})
    bad = subprocess.run([*cmd, "solve", "../proj/bad.yaml"], cwd=tmp_path / "elsewhere",
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and bad.stdout == ""
    assert one_line(bad.stderr).startswith(
        f"autoshard: error: ../proj/bad.yaml: model.hf_config: {real(proj)}/missing.json: no such file")


def test_batch_from_any_directory_and_unchanged_from_another(proj, tmp_path, monkeypatch):
    (proj / "study.yaml").unlink()  # a study is skipped by batch anyway; keep the listing short
    out = tmp_path / "out"
    first = run_batch([str(proj)], str(out), jobs=1, time_limit_s=30)
    assert first.exit_code == 0, [(p.name, p.status, p.message) for p in first.problems]
    assert {p.name: p.status for p in first.problems} == {"problem": "optimal"}
    rec = json.loads((out / "problem.json").read_text(encoding="utf-8"))
    assert rec["problem"]["gpu"] == "h100-sxm"
    # The same files from another working directory and another spelling of the path: unchanged.
    monkeypatch.chdir(proj)
    again = run_batch(["."], str(out), jobs=1, time_limit_s=30)
    assert {p.name: p.status for p in again.problems} == {"problem": "skipped-unchanged"}
    assert input_key("problem.yaml", 30, 3) == input_key(proj / "problem.yaml", 30, 3)
    # A change to a file the problem names (next to it, not in the cwd) is a change.
    write(proj / "overlay.yaml", {"gpus": {"h100": {"efficiency": {**OVERLAY["gpus"]["h100"]["efficiency"], "hbm": 0.8}}}})
    monkeypatch.chdir(tmp_path / "elsewhere")
    edited = run_batch([str(proj)], str(out), jobs=1, time_limit_s=30)
    assert {p.name: p.status for p in edited.problems} == {"problem": "optimal"}


def test_batch_cli_missing_relative_file(proj, tmp_path, capsys):
    (proj / "study.yaml").unlink()
    write(proj / "problem.yaml", {**PROBLEM, "model": {"hf_config": "gone.json"}})
    rc, _, _ = main(capsys, "batch", str(proj), "-o", str(tmp_path / "out"), "--quiet")
    assert rc == 2
    rec = json.loads((tmp_path / "out" / "problem.json").read_text(encoding="utf-8"))
    assert rec["error"]["message"].startswith(
        f"{proj / 'problem.yaml'}: model.hf_config: {real(proj)}/gone.json: no such file")


# ---- what-if studies -------------------------------------------------------------------------------


def test_study_paths_are_relative_to_the_study_file(proj):
    study = load_study(Path("..") / "proj" / "study.yaml")
    (opt,) = study.options
    assert opt.catalog == real(proj / "overlay.yaml")
    assert study.workloads[0].model.hidden_size == model_from_hf_config(HF).hidden_size


@pytest.mark.parametrize("patch, expect", [
    ({"options": [{"gpu": "h100-sxm", "num_gpus": 8, "catalog": "nope.yaml"}]},
     "{study}: options.0.catalog: calibrated catalog '{proj}/nope.yaml' not found"),
    ({"workloads": [{**STUDY["workloads"][0], "model": {"hf_config": "nope.json"}}]},
     "{study}: workloads.0.model.hf_config: {proj}/nope.json: no such file (expected a Hugging Face config.json)"),
])
def test_study_missing_relative_files(proj, capsys, patch, expect):
    path = str(write(proj / "bad-study.yaml", {**STUDY, **patch}))
    line = expect.format(study=path, proj=real(proj))
    with pytest.raises(InputError) as exc:
        load_study(path)
    assert str(exc.value) == line
    rc, out, err = main(capsys, "whatif", path, "-o", "out")
    assert rc == 2 and out == "" and one_line(err) == f"autoshard: error: {line}"
    assert not Path("out").exists()


def test_study_dict_reads_paths_relative_to_the_working_directory(proj, monkeypatch):
    with pytest.raises(InputError, match="options.0.catalog: calibrated catalog 'overlay.yaml' not found"):
        load_study({**STUDY, "workloads": [{**STUDY["workloads"][0], "model": "llama3-8b"}]})
    monkeypatch.chdir(proj)
    assert load_study(STUDY).options[0].catalog == "overlay.yaml"


def test_whatif_cli_from_another_directory(proj, capsys):
    rc, _, err = main(capsys, "whatif", "../proj/study.yaml", "-o", "out", "--quiet")
    assert rc == 0, err
    doc = json.loads(Path("out/results.json").read_text(encoding="utf-8"))
    assert doc["options"] == ["h100-sxm/8/dgx-h100-superpod+overlay/cloud"]
    assert all(r["feasible"] for r in doc["rows"]), doc["rows"]
