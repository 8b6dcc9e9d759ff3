"""`autoshard batch --executor dask`: the same records as the local executor, solved on a Dask cluster
started in another process; incremental reruns; an interrupt keeps what finished; bad arguments are one
line of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from autoshard.batch import run_batch
from autoshard.cli import main as cli_main
from autoshard.errors import InputError
from autoshard.render import strip_timing
from autoshard.whatif import DASK_EXTRA_HINT

from tests.test_batch import TINY, copy_inputs

CLUSTER = """
import sys, time
from distributed import LocalCluster
c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                 scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"})
print(c.scheduler_address, flush=True)
sys.stdin.read()  # until the test closes our stdin
c.close()
"""


@pytest.fixture(scope="module")
def scheduler():
    """A LocalCluster of two worker processes, started by another Python process; its address."""
    pytest.importorskip("distributed")
    proc = subprocess.Popen([sys.executable, "-c", CLUSTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        address = proc.stdout.readline().strip()
        assert address.startswith("tcp://"), address
        yield address
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _records(out: Path) -> dict[str, object]:
    """Every record and report of a batch, timing stripped ('abs_path' is where the problem lies: the same)."""
    got = {}
    for p in sorted(out.iterdir()):
        if p.suffix == ".json":
            got[p.name] = strip_timing(json.loads(p.read_text()))
        elif p.suffix == ".md":
            got[p.name] = strip_timing(p.read_text())
    return got


def _inputs(tmp_path: Path) -> Path:
    src = copy_inputs(tmp_path / "in")  # two good problems, a malformed and an infeasible one
    (src / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    return src


def test_dask_records_identical_to_local(tmp_path, scheduler):
    src = _inputs(tmp_path)
    local = run_batch([src], tmp_path / "local", jobs=1, time_limit_s=30)
    dask = run_batch([src], tmp_path / "dask", time_limit_s=30, executor="dask", scheduler=scheduler)
    assert _records(tmp_path / "dask") == _records(tmp_path / "local")
    assert len(_records(tmp_path / "local")) == 10  # 5 problems x (record, report)
    assert [(p.name, p.result) for p in dask.problems] == [(p.name, p.result) for p in local.problems]
    assert dask.exit_code == local.exit_code == 2  # the malformed problem is bad input in both
    # incremental: a rerun on the cluster solves nothing and rewrites nothing
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "dask").iterdir() if p.name != "summary.csv"}
    again = run_batch([src], tmp_path / "dask", time_limit_s=30, executor="dask", scheduler=scheduler)
    assert {p.status for p in again.problems} == {"skipped-unchanged"}
    assert before == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "dask").iterdir() if p.name != "summary.csv"}
    # the cluster holds nothing of ours afterwards
    import distributed  # noqa: PLC0415

    with distributed.Client(scheduler) as client:
        assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0


def test_interrupt_keeps_finished_records(tmp_path, scheduler):
    src = _inputs(tmp_path)
    seen = []

    def progress(done, total, name, status):
        seen.append(name)
        if done == 2:  # the first record of a solved problem is written: interrupt
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as exc:
        run_batch([src], tmp_path / "out", time_limit_s=30, executor="dask", scheduler=scheduler, progress=progress)
    done = exc.value.batch_result.problems
    assert len(done) == 2
    out = tmp_path / "out"
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted([*(f"{p.name}.json" for p in done), *(f"{p.name}.md" for p in done), "summary.csv"])
    assert not [p for p in out.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
    # a rerun keeps them (skipped-unchanged) and solves the rest
    time.sleep(0.01)
    rerun = run_batch([src], out, time_limit_s=30, executor="dask", scheduler=scheduler)
    status = {p.name: p.status for p in rerun.problems}
    assert all(status[p.name] == "skipped-unchanged" for p in done)
    assert len(status) == 5


def test_cli_local_cluster_started_for_the_run(tmp_path, capsys):
    pytest.importorskip("distributed")
    src = tmp_path / "in"
    src.mkdir()
    (src / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    rc = cli_main(["batch", str(src), "-o", str(tmp_path / "dask"), "--executor", "dask", "--jobs", "1", "--quiet"])
    assert rc == 0
    rc = cli_main(["batch", str(src), "-o", str(tmp_path / "local"), "--quiet"])
    assert rc == 0
    assert _records(tmp_path / "dask") == _records(tmp_path / "local")


def test_bad_executor_arguments(tmp_path, capsys, monkeypatch):
    src = tmp_path / "in"
    src.mkdir()
    (src / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    with pytest.raises(InputError, match="unknown executor 'ray'"):
        run_batch([src], tmp_path / "a", executor="ray")
    with pytest.raises(InputError, match="needs the dask executor"):
        run_batch([src], tmp_path / "b", scheduler="tcp://127.0.0.1:8786")
    rc = cli_main(["batch", str(src), "-o", str(tmp_path / "c"), "--executor", "local", "--scheduler",
                   "tcp://127.0.0.1:8786"])
    assert rc == 2 and "--scheduler: a scheduler address needs --executor dask" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` raises ImportError
    rc = cli_main(["batch", str(src), "-o", str(tmp_path / "d"), "--executor", "dask"])
    assert rc == 2 and capsys.readouterr().err == f"autoshard: error: {DASK_EXTRA_HINT}\n"
    assert not any((tmp_path / d).exists() for d in "abcd")


def test_run_on_dask_closes_the_cluster_it_started_and_keeps_what_finished(monkeypatch):
    """The one Dask helper of batch and whatif (`dask_run.run_on_dask`): an interrupt raised while the
    results come in reaches the caller, the results handed over before it are kept, and the client and
    the LocalCluster started for the run are closed; a task that raises is passed to `on_error`."""
    pytest.importorskip("distributed")
    import autoshard.dask_run as dask_run  # noqa: PLC0415

    started = []

    def spy(distributed, n_workers):
        started.append((real(distributed, n_workers), n_workers))
        return started[-1][0]

    real = dask_run.local_cluster
    monkeypatch.setattr(dask_run, "local_cluster", spy)
    kept: list[tuple[int, object]] = []

    def on_result(item, res):
        kept.append((item, res))
        if len(kept) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dask_run.run_on_dask([4, 0, 9], _inverse, jobs=8, scheduler=None, key_prefix="autoshard-test",
                             on_result=on_result, on_error=lambda item, exc: type(exc).__name__)
    (cluster, n_workers), = started
    assert n_workers == 3  # one worker per item at most
    assert len(kept) == 2 and all(res == (1 / item if item else "ZeroDivisionError") for item, res in kept)
    assert cluster.status.name == "closed"


def _inverse(x: int) -> float:
    return 1 / x
