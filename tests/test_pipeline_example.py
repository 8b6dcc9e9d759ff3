"""docs/pipeline.md cannot rot: its Python example and its command-line example run here as written.

Each runs in a temporary directory that holds a copy of the files the examples name
(`tests/data/hf/Meta-Llama-3-8B.json`), so that nothing is written into the repository.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "pipeline.md"
HF_CONFIG = "tests/data/hf/Meta-Llama-3-8B.json"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    dst = tmp_path / HF_CONFIG
    dst.parent.mkdir(parents=True)
    shutil.copyfile(REPO / HF_CONFIG, dst)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_doc_has_one_example_of_each_kind():
    assert len(blocks("python")) == 1
    assert len(blocks("yaml")) == 1
    assert len(blocks("bash")) == 1


def test_python_example_runs(workdir):
    (code,) = blocks("python")
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {"__name__": "__docs__"})  # noqa: S102
    elapsed = time.perf_counter() - t0
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0].startswith("OPTIMAL: "), text
    assert "predicted" in lines[1] and "s/step" in lines[1], text
    launch = [ln for ln in lines if ln.startswith("torchrun ")]
    assert len(launch) == 1, text
    assert " pretrain_gpt.py --tensor-model-parallel-size " in launch[0]
    assert "--seq-length 32768" in launch[0] and "--global-batch-size 16" in launch[0]
    assert "\\" not in launch[0] and "#" not in launch[0]
    assert not any(ln.startswith("warning:") for ln in lines), text
    # The doc states what the example prints; keep the stated plan true.
    assert lines[0] in DOC.read_text(encoding="utf-8"), f"docs/pipeline.md shows another plan than {lines[0]!r}"
    assert elapsed < 30, f"the example took {elapsed:.1f} s; keep its search small"
    assert not list(workdir.glob("*.json")), "the Python example must not write files"


def test_cli_example_runs(workdir):
    exe = Path(sys.executable).parent / "autoshard"
    if not exe.exists() and shutil.which("autoshard") is None:
        pytest.skip("the `autoshard` console script is not installed")
    (yaml_text,) = blocks("yaml")
    (script,) = blocks("bash")
    (workdir / "problem.yaml").write_text(yaml_text, encoding="utf-8")
    env = dict(os.environ, PATH=f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=workdir, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (workdir / "sol.json").is_file()
    args = (workdir / "megatron-args.sh").read_text(encoding="utf-8")
    assert "--tensor-model-parallel-size" in args and "--seq-length 32768" in args
    assert "warning" not in res.stderr, res.stderr
