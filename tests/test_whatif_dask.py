"""The optional Dask executor of what-if studies: same results as the local process pool, on a local
cluster of two workers; interrupts keep what finished; a missing extra is one line of bad input."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from autoshard.cli import main as cli_main
from autoshard.errors import InputError
from autoshard.whatif import DASK_EXTRA_HINT, run_study

from tests.test_whatif import SMALL, run_interrupted  # the small fast study: restricted plan space, proven optimal

TIMING = ("solve_time_s", "task_time_s", "elapsed_s", "timing")


def _strip(d):
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items() if k not in TIMING}
    if isinstance(d, list):
        return [_strip(v) for v in d]
    return d


def _results(out) -> tuple[str, list[str]]:
    """results.json without its timing fields (key order kept) and results.csv without solve_time_s."""
    doc = json.loads((out / "results.json").read_text())
    lines = (out / "results.csv").read_text().splitlines()
    col = lines[0].split(",").index("solve_time_s")
    assert col == len(lines[0].split(",")) - 1  # the last column: cut it off each line
    return json.dumps(_strip(doc), indent=1), [ln.rsplit(",", 1)[0] for ln in lines]


@pytest.fixture(scope="module")
def distributed():
    return pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def scheduler(distributed):
    """An existing cluster to connect to by address (threads: quick to start)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                                  scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"}) as c:
        yield c.scheduler_address


def test_dask_results_equal_local(tmp_path, distributed):
    local = run_study(SMALL, tmp_path / "local", jobs=2, report=False)
    seen = []
    dask = run_study(SMALL, tmp_path / "dask", jobs=2, report=False, executor="dask",
                     progress=lambda d, t, label: seen.append((d, t, label)))
    assert _results(tmp_path / "dask") == _results(tmp_path / "local")
    assert dask.document["timing"]["executor"] == "dask" and local.document["timing"]["executor"] == "local"
    assert dask.recommended == local.recommended
    # progress as with the local pool: 0 first, then once per finished task, with its label
    assert seen[0] == (0, 3, "") and [d for d, _, _ in seen] == [0, 1, 2, 3]
    assert {label for _, _, label in seen[1:]} == {"llama3-8b on h100-sxm/8/dgx-h100-superpod",
                                                  "llama3-8b on h100-sxm/16/dgx-h100-superpod",
                                                  "llama3-8b on b200/8/dgx-b200"}


def test_existing_scheduler_by_address(tmp_path, scheduler):
    study = {**SMALL, "sensitivity": "off", "pricing": {"mode": "cloud"}}
    run_study(study, tmp_path / "local", report=False)
    res = run_study(study, tmp_path / "dask", report=False, executor="dask", scheduler=scheduler)
    assert _results(tmp_path / "dask") == _results(tmp_path / "local")
    assert res.document["complete"] is True and len(res.rows) == 3


def test_interrupt_cancels_and_keeps_finished_rows(tmp_path, distributed, scheduler):
    doc = run_interrupted(tmp_path, executor="dask", scheduler=scheduler)
    assert doc["complete"] is False and len(doc["rows"]) == 1 and doc["timing"]["tasks_done"] == 1
    assert not (tmp_path / "report.html").exists()
    with distributed.Client(scheduler) as client:  # our futures were released: the cluster holds nothing
        assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0


def test_cli_dask_executor(tmp_path, capsys, distributed):
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({**SMALL, "sensitivity": "off", "pricing": {"mode": "cloud"}}))
    rc = cli_main(["whatif", str(study), "-o", str(tmp_path / "out"), "--executor", "dask", "--jobs", "2", "--quiet"])
    assert rc == 0
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["complete"] is True and doc["timing"]["executor"] == "dask" and len(doc["rows"]) == 3
    assert (tmp_path / "out" / "report.html").exists()


def test_missing_extra_is_one_line_of_bad_input(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` raises ImportError
    with pytest.raises(InputError) as exc:
        run_study(SMALL, tmp_path / "out", executor="dask")
    assert exc.value.line() == DASK_EXTRA_HINT == "the dask executor needs `pip install 'autoshard[dask]'`"
    assert not (tmp_path / "out").exists()  # failed before any work

    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(SMALL))
    rc = cli_main(["whatif", str(study), "-o", str(tmp_path / "out"), "--executor", "dask"])
    err = capsys.readouterr().err
    assert rc == 2 and err == f"autoshard: error: {DASK_EXTRA_HINT}\n"
    rc = cli_main(["whatif", str(study), "-o", str(tmp_path / "out"), "--scheduler", "tcp://127.0.0.1:8786"])
    assert rc == 2 and capsys.readouterr().err == f"autoshard: error: {DASK_EXTRA_HINT}\n"  # implies dask


def test_bad_executor_arguments(tmp_path, capsys):
    with pytest.raises(InputError, match="unknown executor 'ray'"):
        run_study(SMALL, tmp_path / "a", executor="ray")
    with pytest.raises(InputError, match="needs the dask executor"):
        run_study(SMALL, tmp_path / "b", scheduler="tcp://127.0.0.1:8786")
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(SMALL))
    rc = cli_main(["whatif", str(study), "-o", str(tmp_path / "c"), "--executor", "local",
                   "--scheduler", "tcp://127.0.0.1:8786"])
    assert rc == 2 and "--scheduler: a scheduler address needs --executor dask" in capsys.readouterr().err
    assert not any((tmp_path / d).exists() for d in "abc")


def test_unreachable_scheduler_is_bad_input(tmp_path, distributed):
    import dask

    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        with pytest.raises(InputError, match="cannot connect to the dask scheduler") as exc:
            run_study({**SMALL, "sensitivity": "off"}, tmp_path, executor="dask", scheduler="tcp://127.0.0.1:9")
    assert exc.value.line().startswith("tcp://127.0.0.1:9: ")


def test_dask_sigterm_exits_143_without_tracebacks(tmp_path, distributed):
    """SIGTERM during a sweep on a local Dask cluster: the finished options written, exit 143, only
    the progress line and the interrupt line on stderr (no CommClosedError / gather errors)."""
    import os
    import signal
    import subprocess

    from tests.test_whatif import SIGNAL_STUDY

    path = tmp_path / "study.json"
    path.write_text(json.dumps(SIGNAL_STUDY))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "autoshard.cli", "whatif", str(path), "-o", str(out),
                             "--executor", "dask", "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    err = []
    for line in proc.stderr:
        err.append(line)
        if line.startswith("[1/"):
            break
    os.kill(proc.pid, signal.SIGTERM)
    _, rest = proc.communicate(timeout=120)
    lines = ("".join(err) + rest).splitlines()
    assert proc.returncode == 143, lines
    assert lines[-1] == "autoshard: interrupted; finished outputs were kept" and len(lines) == len(err) + 1, lines
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is False and doc["rows"]
