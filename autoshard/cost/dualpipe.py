"""DualPipe's step as its code runs it: the per-rank order of chunks and point-to-point transfers of
`DualPipe.step` (github.com/deepseek-ai/DualPipe, dualpipe/dualpipe.py, commit 3da1bbe), replayed with
each chunk's priced duration (`dualpipe_time`).

The README's bubble, (PP/2 - 1)(F&B + B - 3W), is the idealised count of chunk slots a rank waits; the
code's schedule differs from it in what each slot costs, and those differences are real time:

- the warm-up (steps 1-3) runs forward chunks and zero-bubble backward chunks alone, and the cool-down
  (steps 5-7) backward chunks alone: a chunk with no partner of the other direction has nothing to
  hide its expert all-to-all under (DeepSeek-V3 report sec. 3.2.1, Fig. 4: the overlap is the pair's),
  so it pays its dispatch and combine in full, without the 20 communication SMs' slowdown;
- only step 4 (and step 5's second half) runs the paired `_forward_backward_chunk`, priced as the
  layer table prices a pair (all-to-all hidden, computation on the SMs the communication leaves);
- the middle ranks' first main-step pair is run unoverlapped ("We don't overlap these two chunks to
  further reduce bubble size");
- every chunk starts with `_commit_and_wait_comm`: the sends queued after the previous chunk and the
  receives this chunk needs go out as one `batch_isend_irecv` and are waited for before it computes,
  so a transfer is blocking on both ranks and completes once both have posted it (NCCL
  point-to-point is a rendezvous): a rank stalls until its neighbour reaches the matching chunk.

Each rank's chunks run one at a time on its compute stream; a transfer of one micro-batch's
activation (or gradient) takes `p2p_s`, and two transfers between the same two ranks in one batch
share their link (summed).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .table import Table

# An op of one rank: ("commit", ((key, peer), ...)) or ("F", d) / ("B", d, zb) / ("FB", d_f, d_b) /
# ("F|B", d_f, d_b) (the middle ranks' unoverlapped pair) / ("W", d): d is the direction (0: rank 0 ->
# P-1, 1: rank P-1 -> 0), which names the rank's stage: stage r of direction 0, stage P-1-r of direction 1.
Op = tuple


@dataclass
class _Rank:
    """Transcription of DualPipe's per-rank state: chunk counters and queued transfers, recording ops."""
    rank: int
    ranks: int
    ops: list[Op] = field(default_factory=list)
    pending: list[tuple[tuple, int]] = field(default_factory=list)
    f_id: list[int] = field(default_factory=lambda: [0, 0])
    b_id: list[int] = field(default_factory=lambda: [0, 0])
    send_f: list[int] = field(default_factory=lambda: [0, 0])
    send_b: list[int] = field(default_factory=lambda: [0, 0])
    recv_f: list[int] = field(default_factory=lambda: [0, 0])
    recv_b: list[int] = field(default_factory=lambda: [0, 0])
    zb_queue: list[int] = field(default_factory=list)

    @property
    def second_half(self) -> int:
        return int(self.rank >= self.ranks // 2)

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.ranks - 1

    def _last_stage(self, d: int) -> bool:
        return (self.first and d == 1) or (self.last and d == 0)

    def _first_stage(self, d: int) -> bool:
        return (self.first and d == 0) or (self.last and d == 1)

    # -- communication (`_recv_forward`, `_send_forward`, `_recv_backward`, `_send_backward`) --
    def recv_forward(self, phase: int) -> None:
        d = phase ^ self.second_half
        if self._first_stage(d):
            return
        src = self.rank - 1 if d == 0 else self.rank + 1
        self.pending.append((("f", d, self.recv_f[d], src, self.rank), src))
        self.recv_f[d] += 1

    def send_forward(self, phase: int) -> None:
        d = phase ^ self.second_half
        if self._last_stage(d):
            return
        dst = self.rank + 1 if d == 0 else self.rank - 1
        self.pending.append((("f", d, self.send_f[d], self.rank, dst), dst))
        self.send_f[d] += 1

    def recv_backward(self, phase: int) -> None:
        d = phase ^ self.second_half
        if self._last_stage(d):
            return
        src = self.rank + 1 if d == 0 else self.rank - 1
        self.pending.append((("b", d, self.recv_b[d], src, self.rank), src))
        self.recv_b[d] += 1

    def send_backward(self, phase: int) -> None:
        d = phase ^ self.second_half
        if self._first_stage(d):
            return
        dst = self.rank - 1 if d == 0 else self.rank + 1
        self.pending.append((("b", d, self.send_b[d], self.rank, dst), dst))
        self.send_b[d] += 1

    def commit(self) -> None:
        if self.pending:
            self.ops.append(("commit", tuple(self.pending)))
            self.pending = []

    # -- chunks (`_forward_chunk`, `_backward_chunk`, `_forward_backward_chunk`, `_weight_chunk`) --
    def forward_chunk(self, phase: int, recv: bool = True, send: bool = True) -> None:
        if recv:
            self.recv_forward(phase)
        self.commit()
        self.ops.append(("F", phase ^ self.second_half))
        if send:
            self.send_forward(phase)

    def backward_chunk(self, phase: int, enable_zb: bool = False, recv: bool = True, send: bool = True) -> None:
        if recv:
            self.recv_backward(phase)
        self.commit()
        d = phase ^ self.second_half
        self.ops.append(("B", d, enable_zb))
        if enable_zb:
            self.zb_queue.append(d)
        if send:
            self.send_backward(phase)

    def forward_backward_chunk(self, phase0: int, phase1: int, recv0: bool = True) -> None:
        if recv0:
            self.recv_forward(phase0)
        self.recv_backward(phase1)
        self.commit()
        self.ops.append(("FB", phase0 ^ self.second_half, phase1 ^ self.second_half))
        self.send_forward(phase0)
        self.send_backward(phase1)

    def weight_chunk(self) -> None:
        self.commit()
        self.ops.append(("W", self.zb_queue.pop(0)))  # "Assume FIFO" (WeightGradStore.pop)


@functools.lru_cache(maxsize=64)
def dualpipe_ops(ranks: int, chunks: int) -> tuple[tuple[Op, ...], ...]:
    """Per rank, the ops `DualPipe.step(num_chunks=chunks)` runs, in order: its steps 1-8 transcribed."""
    assert ranks % 2 == 0 and chunks % 2 == 0 and chunks >= 2 * ranks, (ranks, chunks)
    out = []
    half_ranks, half_chunks = ranks // 2, chunks // 2
    for rank in range(ranks):
        s = _Rank(rank, ranks)
        half_rank = min(rank, ranks - 1 - rank)
        middle = rank in (half_ranks - 1, half_ranks)
        for _ in range((half_ranks - half_rank - 1) * 2):  # step 1: nF0
            s.forward_chunk(0)
        step_2 = half_rank + 1  # step 2: nF0F1
        s.recv_forward(0)
        for i in range(step_2):
            s.forward_chunk(0, recv=False, send=middle)
            s.recv_forward(0)
            s.forward_chunk(1, send=(not middle) or (i < step_2 - 1))
            if not middle:
                s.send_forward(0)
        for _ in range(half_ranks - half_rank - 1):  # step 3: nB1W1F1 (zero bubble)
            s.backward_chunk(1, enable_zb=True)
            s.recv_forward(1)
            s.weight_chunk()
            s.forward_chunk(1, recv=False)
        for i in range(half_chunks - ranks + half_rank + 1):  # step 4 (main): nF0B1F1B0
            if i == 0:
                if middle:  # "We don't overlap these two chunks to further reduce bubble size."
                    s.forward_chunk(0, recv=False, send=False)
                    s.send_forward(1)
                    s.backward_chunk(1, send=False)
                    s.send_forward(0)
                    s.send_backward(1)
                else:
                    s.forward_backward_chunk(0, 1, recv0=False)
            else:
                s.forward_backward_chunk(0, 1)
            s.forward_backward_chunk(1, 0)
        for _ in range(half_ranks - half_rank - 1):  # step 5: nB1F1B0
            s.backward_chunk(1)
            s.forward_backward_chunk(1, 0)
        enable_zb = False  # step 6: nB1B0 (the second half of the chunks zero bubble)
        step_6 = half_rank + 1
        for i in range(step_6):
            if i == step_6 // 2 and half_rank % 2 == 1:
                enable_zb = True
            s.backward_chunk(1, enable_zb=enable_zb)
            if i == step_6 // 2 and half_rank % 2 == 0:
                enable_zb = True
            s.backward_chunk(0, enable_zb=enable_zb)
        for _ in range(half_ranks - half_rank - 1):  # step 7: nWB0 (zero bubble)
            s.weight_chunk()
            s.backward_chunk(0, enable_zb=True)
        for _ in range(half_rank + 1):  # step 8: nW
            s.weight_chunk()
        assert not s.zb_queue
        s.commit()  # the step's final `_commit_and_wait_comm`
        out.append(tuple(s.ops))
    return tuple(out)


def simulate(ops: Sequence[Sequence[Op]], duration: Callable[[int, Op], float], p2p_s: float) -> list[float]:
    """Each rank's finish time: ops run in order on one stream; a commit waits until every transfer in
    it is posted by both ranks, then their transfer time (transfers between the same two ranks in one
    batch one after the other). Raises RuntimeError if the ranks deadlock (a transcription error)."""
    n = len(ops)
    clock = [0.0] * n
    pos = [0] * n
    waiting = [False] * n  # the rank has posted the batch at pos[r] and waits for its neighbours
    posted: dict[tuple, float] = {}  # (transfer key, rank) -> when the rank posted it
    while True:
        progress = False
        for r in range(n):
            rank_ops, i, now = ops[r], pos[r], clock[r]
            while i < len(rank_ops):
                op = rank_ops[i]
                if op[0] != "commit":
                    now += duration(r, op)
                    i += 1
                    continue
                if not waiting[r]:
                    for key, _peer in op[1]:
                        posted[key, r] = now
                    waiting[r] = True
                if any((key, peer) not in posted for key, peer in op[1]):
                    break  # a neighbour has not reached the matching batch yet
                per_peer: dict[int, float] = {}
                for key, peer in op[1]:
                    start = max(posted[key, r], posted[key, peer])
                    per_peer[peer] = max(per_peer.get(peer, 0.0), start) + p2p_s
                now = max(now, *per_peer.values())
                waiting[r] = False
                i += 1
            progress |= i != pos[r] or now != clock[r]
            pos[r], clock[r] = i, now
        if all(pos[r] == len(ops[r]) for r in range(n)):
            return clock
        if not progress:
            raise RuntimeError("DualPipe replay deadlocked")


@dataclass(frozen=True)
class Replay:
    """A DualPipe step replayed (`dualpipe_time`): the pipeline's makespan and how it splits."""
    makespan_s: float  # first chunk to the last rank's last chunk and transfer
    steady_s: float  # the busiest rank's chunks, all priced as pairs (M / 2 x both stages' F + B)
    bubble_s: float  # what the schedule's order adds with every chunk priced as a pair, no transfers
    unpaired_ep_s: float  # the all-to-all of the chunks the schedule runs alone (warm-up, cool-down)
    pp_comm_s: float  # the point-to-point transfers, waited for before each chunk


def _stage_costs(table: Table, stages: list[list[tuple[str, str]]]) -> list[tuple[float, float, float]]:
    """(forward, full backward, weight-gradient part) of one micro-batch through each stage; stage 0
    carries the embedding and the last stage the head (with any MTP module), as in `rank_totals`."""
    out = []
    for s, chunk in enumerate(stages):
        pieces = [table.layers[key] for key in chunk]
        pieces += [table.embed] if s == 0 else []
        pieces += [table.head] if s == len(stages) - 1 else []
        out.append((sum(c.fwd_s for c in pieces), sum(c.bwd_s for c in pieces), sum(c.wgrad_s for c in pieces)))
    return out


def dualpipe_time(paired: Table, alone: Table, stages: list[list[tuple[str, str]]]) -> Replay:
    """Replay `DualPipe.step` (`dualpipe_ops`) over `stages` (P stage layer lists; rank r holds stage r
    of direction 0 and stage P-1-r of direction 1) with `paired.microbatches` micro-batches.

    A `_forward_backward_chunk` costs the forward of one stage and the backward of the other as
    `paired` prices them (the EP all-to-all under the other chunk's computation, DeepSeek-V3 report
    sec. 3.2.1); a forward, backward or weight chunk run alone costs what `alone` prices (the
    all-to-all exposed); a zero-bubble backward is the full backward less its weight-gradient part,
    run later as the weight chunk. Transfers take `paired.pp_p2p_s` each (`simulate`)."""
    pp, m = len(stages), paired.microbatches
    pair, solo = _stage_costs(paired, stages), _stage_costs(alone, stages)
    ops = dualpipe_ops(pp, m)

    def stage(r: int, d: int) -> int:
        return r if d == 0 else pp - 1 - r

    def duration(costs_alone: list[tuple[float, float, float]]) -> Callable[[int, Op], float]:
        def of(r: int, op: Op) -> float:
            kind = op[0]
            if kind == "FB":
                return pair[stage(r, op[1])][0] + pair[stage(r, op[2])][1]
            f, b, w = costs_alone[stage(r, op[1])]
            if kind == "F":
                return f
            if kind == "W":
                return w
            return b - w if op[2] else b  # "B": zero-bubble defers the weight gradients
        return of

    steady = m / 2 * max(pair[stage(r, 0)][0] + pair[stage(r, 0)][1] + pair[stage(r, 1)][0] + pair[stage(r, 1)][1]
                         for r in range(pp))
    order = max(simulate(ops, duration(pair), 0.0))
    exposed = max(simulate(ops, duration(solo), 0.0))
    full = max(simulate(ops, duration(solo), paired.pp_p2p_s))
    return Replay(makespan_s=full, steady_s=steady, bubble_s=order - steady, unpaired_ep_s=exposed - order,
                  pp_comm_s=full - exposed)
