"""Running `autoshard ARGS` inside a test: exit code and captured output, and the one-line rule."""

from autoshard import cli


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """`autoshard ARGS` in this process: (exit code, stdout, stderr)."""
    try:
        rc = cli.main(list(args))
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str) -> str:
    """The single stderr line a bad input gets (no traceback)."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"expected exactly one line on stderr, got {err!r}"
    return lines[0]
