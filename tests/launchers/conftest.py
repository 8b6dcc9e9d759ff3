"""The launcher suite runs last: it imports torch, JAX and the launchers into the test process
(threads, fake process groups), and tests that fork workers (whatif's local executor) must run
before that, as they do in a process without them."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(session, config, items) -> None:
    mine = [it for it in items if HERE in Path(str(it.path)).resolve().parents]
    if mine:
        rest = [it for it in items if HERE not in Path(str(it.path)).resolve().parents]
        items[:] = rest + mine
