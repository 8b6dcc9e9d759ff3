"""nccl-tests output (`all_reduce_perf`, `all_gather_perf`, `reduce_scatter_perf`, `alltoall_perf`, ...)
-> bus bandwidth by message size, with the number of ranks and of nodes.

The format is the one NVIDIA/nccl-tests prints (`src/util.cu`): `# Collective test starting: NAME`,
`# nThread T nGpus G minBytes ... `, `# Using devices`, one `#  Rank  R Group  G Pid  P on HOST device
D [bus id] GPU NAME` line per rank, a two-line header (`#       size         count      type   redop
  root     time   algbw   busbw #wrong     time   algbw   busbw #wrong`), one row per size with the
out-of-place then the in-place time (us), algbw and busbw (GB/s) and #wrong (or `N/A` without
validation), then `# Out of bounds values : ...`, `# Avg bus bandwidth    : X` and `# Collective test
concluded: NAME`. Older releases print `# nccl-tests version ...` lines differently and no
`starting` line; the collective is then read from the `concluded` line or the file name.
Per-iteration columns (`-I 1`: i_min, i_max, i_p99, i_cv%) are recognised by the header.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .files import MAX_NCCL_BYTES, at_line, read_text

STARTING = re.compile(r"^# Collective test (?:starting|concluded): (\S+)")
RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s*(.*)$")
HEADER = re.compile(r"^#\s+size\s+count\s+type\s+redop\s+(root\s+)?(\S+)")
# what launchers put before each line: Open MPI --tag-output "[1,0]<stdout>:", srun --label "0: "
PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\d+: )")
AVG = re.compile(r"^# Avg bus bandwidth\s*:\s*(\S+)")
KIND = re.compile(r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv|gather|scatter|hypercube)")


@dataclass
class NcclRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    time_us: float  # out-of-place
    algbw_gb_per_s: float
    busbw_gb_per_s: float
    inplace_busbw_gb_per_s: float | None
    line: int


@dataclass
class NcclTest:
    path: str
    collective: str  # all_reduce, all_gather, reduce_scatter, alltoall, ...
    ranks: int
    nodes: int
    gpu_name: str | None
    rows: list[NcclRow]
    avg_busbw_gb_per_s: float | None
    notes: list[str] = field(default_factory=list)

    def large_busbw_gb_per_s(self, min_bytes: int) -> tuple[float, list[NcclRow]]:
        """The bus bandwidth at large sizes: the best of the out-of-place and in-place busbw, median
        over the rows of at least `min_bytes` (else the largest row)."""
        big = [r for r in self.rows if r.size_bytes >= min_bytes] or [max(self.rows, key=lambda r: r.size_bytes)]
        vals = sorted(max(r.busbw_gb_per_s, r.inplace_busbw_gb_per_s or 0.0) for r in big)
        n = len(vals)
        med = vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2
        return med, big


def _num(path: str, line: int, text: str, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise at_line(path, line, f"{what} is not a number: {text!r}") from None
    if v < 0 or v != v or v == float("inf"):
        raise at_line(path, line, f"{what} must be a finite number >= 0, got {text}")
    return v


def read_nccl_tests(path: str | os.PathLike[str]) -> NcclTest:
    src = str(path)
    text = read_text(src, MAX_NCCL_BYTES, "nccl-tests output")
    name = None
    hosts: list[str] = []
    ranks: set[int] = set()
    gpu = None
    rows: list[NcclRow] = []
    header_at = None
    per_iter = False
    has_root = True
    avg = None
    for no, raw in enumerate(text.splitlines(), 1):
        line = PREFIX.sub("", raw.rstrip())
        m = STARTING.match(line)
        if m:
            name = name or m.group(1)
            continue
        m = RANK.match(line)
        if m:
            ranks.add(int(m.group(1)))
            hosts.append(m.group(4))
            gpu = gpu or m.group(6).strip() or None
            continue
        m = HEADER.match(line)
        if m:
            header_at = no
            per_iter = "i_min" in line
            has_root = m.group(1) is not None  # releases before 2.13 print no root column
            continue
        m = AVG.match(line)
        if m:
            avg = _num(src, no, m.group(1), "Avg bus bandwidth")
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if header_at is None:
            continue  # text before the table (launcher output)
        cells = line.split()
        if not cells or not cells[0].isdigit():
            continue  # a warning or a launcher line inside the output
        # size count type redop root | time algbw busbw #wrong [i_min i_max i_p99 i_cv%] | same in-place
        block = 8 if per_iter else 4
        first = 5 if has_root else 4
        if len(cells) < first + block:
            raise at_line(src, no, f"a table row with {len(cells)} columns, expected at least {first + block} "
                                   "(size count type redop [root] time algbw busbw #wrong)")
        oop = cells[first:first + block]
        inp = cells[first + block:first + 2 * block]
        size = int(cells[0])
        try:
            count = int(cells[1])
        except ValueError:
            raise at_line(src, no, f"count is not an integer: {cells[1]!r}") from None
        for wrong in (oop[3], *inp[3:4]):  # out-of-place and in-place #wrong
            if wrong not in ("N/A", "0") and _num(src, no, wrong, "#wrong") > 0:
                raise at_line(src, no, f"#wrong = {wrong}: the collective returned wrong data; its timing is not a "
                                       "measurement")
        rows.append(NcclRow(size, count, cells[2], cells[3], _num(src, no, oop[0], "time"),
                            _num(src, no, oop[1], "algbw"), _num(src, no, oop[2], "busbw"),
                            _num(src, no, inp[2], "in-place busbw") if len(inp) >= 3 else None, no))
    if not rows:
        raise at_line(src, None, "no result rows (expected nccl-tests' '#  size  count  type  redop  root  time  "
                                 "algbw  busbw ...' table)")
    kind_src = name or os.path.basename(src)
    k = KIND.search(kind_src)
    if not k:
        raise at_line(src, None, "which collective? no '# Collective test starting: NAME' line and the file name "
                                 "names none (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf)")
    notes = []
    nranks = len(ranks)
    if not nranks:
        raise at_line(src, header_at, "no '#  Rank R ... on HOST device D' lines: the number of ranks is unknown")
    nodes = len(set(hosts))
    if nodes > 1 and len(hosts) == nranks:
        notes.append(f"{nranks} ranks on {nodes} hosts")
    return NcclTest(src, k.group(1), nranks, nodes, gpu, rows, avg, notes)
