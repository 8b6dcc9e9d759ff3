"""Running tasks on a Dask cluster (optional extra: `pip install 'autoshard[dask]'`), for `batch` and
`whatif` alike (`--executor dask`, `--scheduler ADDRESS`).

`run_on_dask` connects to the scheduler at an address, or starts a `distributed.LocalCluster` of
single-threaded worker processes for the run, submits one task per item (unique keys, the first items
first), and hands each result to the caller as it completes, in this process. It is interrupt-safe:
a Ctrl-C (or a SIGTERM that the caller turns into an exception) while the cluster starts is held
until the cluster is assigned; on any interrupt the pending tasks are cancelled, and the client and a
cluster started here are always closed. What finished before the interrupt has already been handed
to the caller, so it is kept.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from .errors import InputError

DASK_EXTRA_HINT = "the dask executor needs `pip install 'autoshard[dask]'`"

Item = TypeVar("Item")


def import_distributed() -> Any:
    """The `distributed` module, or a one-line InputError naming the extra."""
    try:
        import distributed  # noqa: PLC0415
    except ImportError:
        raise InputError(DASK_EXTRA_HINT) from None
    return distributed


# Run by each worker of a LocalCluster started here (a Dask "preload" given as source text), in the
# worker's main thread: the workers ignore Ctrl-C, like the local pool's workers, and the interrupt
# is handled by the client (cancel, close) instead of by a traceback from every worker.
_WORKER_PRELOAD = """
import signal


def dask_setup(worker):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
"""


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (or a SIGTERM whose Python handler raises) that arrives inside the block and raise
    it on exit: a cluster being started is assigned first, so the caller can close it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved: dict[Any, Any] = {}  # signal -> its handler
    hit: list[tuple[int, Any]] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if callable(previous):  # a Python handler (not SIG_IGN / SIG_DFL): hold its signal
            saved[sig] = previous
            signal.signal(sig, lambda signum, frame: hit.append((signum, frame)))
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)
        if hit:
            signum, frame = hit[0]
            previous = saved[signum]
            if previous is signal.default_int_handler:
                raise KeyboardInterrupt
            previous(signum, frame)


def local_cluster(distributed: Any, n_workers: int) -> Any:
    # On 127.0.0.1, no dashboard, the scheduler's HTTP routes (health, metrics) on a free port instead of
    # 8787 (which another cluster may hold); worker logs only at CRITICAL: a cancel logs warnings, and a
    # stop mid-run logs errors (CommClosedError from heartbeats to the closed scheduler); a task that
    # fails is reported in its row.
    return distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                    dashboard_address=None,
                                    scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
                                    silence_logs=logging.CRITICAL, preload=[_WORKER_PRELOAD])


def _connect(distributed: Any, scheduler: str | None, jobs: int, n_items: int) -> tuple[Any, Any]:
    """(client, cluster started here or None). A scheduler that cannot be reached is bad input, one line."""
    if scheduler:
        try:
            return distributed.Client(scheduler, set_as_default=False), None
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError(f"cannot connect to the dask scheduler: {' '.join(str(exc).split())}",
                             source=scheduler) from None
    cluster = None
    try:
        with sigint_deferred():  # a Ctrl-C while it starts is raised after `cluster` is set
            cluster = local_cluster(distributed, max(1, min(jobs, n_items)))
        return distributed.Client(cluster, set_as_default=False), cluster
    except BaseException:
        _close(cluster)
        raise


def _close(*closables: Any) -> None:
    """Close each (a failure to close must not hide the result or the interrupt)."""
    for closable in closables:
        if closable is not None:
            with contextlib.suppress(Exception):
                closable.close()


def run_on_dask(items: Sequence[Item], fn: Callable[[Item], Any], *, jobs: int, scheduler: str | None,
                key_prefix: str, on_result: Callable[[Item, Any], None],
                on_error: Callable[[Item, BaseException], Any]) -> None:
    """Run `fn(item)` for every item on a Dask cluster: the scheduler at `scheduler`, else a LocalCluster
    of `jobs` single-threaded worker processes started for the run (at most one per item). Each result is
    passed to `on_result(item, result)` in this process as it completes; a task the cluster could not run
    (a lost worker, autoshard missing on a worker) passes `on_error(item, exc)`'s value instead. Items
    are submitted first-first (priority), under keys `{key_prefix}-{run id}-{index}` (a shared scheduler
    may run other sweeps too). On an interrupt the pending tasks are cancelled and the exception raised;
    the client and a cluster started here are closed in every case."""
    distributed = import_distributed()
    client, cluster = _connect(distributed, scheduler, jobs, len(items))
    futures: list[Any] = []
    level: int | None = None
    try:
        run_id = uuid.uuid4().hex[:12]
        by_key: dict[str, Item] = {}
        for i, item in enumerate(items):
            key = f"{key_prefix}-{run_id}-{i}"
            by_key[key] = item
            futures.append(client.submit(fn, item, key=key, pure=False, priority=len(items) - i))
        for fut in distributed.as_completed(futures, loop=client.loop):
            item = by_key[fut.key]
            try:
                res = fut.result()
            except Exception as exc:  # noqa: BLE001  (a lost worker must not sink the run; reported per item)
                res = on_error(item, exc)
            on_result(item, res)
    except BaseException:
        # Interrupted: the cancelled tasks' keys are expected to vanish; the scheduler (in this process
        # for a local cluster) would log that as errors ("Couldn't gather keys").
        quiet = logging.getLogger("distributed")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        if futures:
            with contextlib.suppress(Exception):  # closing below releases them anyway
                client.cancel(futures)
        raise
    finally:
        _close(client, cluster)
        if level is not None:
            logging.getLogger("distributed").setLevel(level)
