"""The data-parallel lines of the profile: compute against communication in the replayed step,
each collective's share, and the ranks side by side.

Read from the record's `profile.sampling.comm` (engine/comm_overlap.py: seconds over the
sampled replays, on both streams) and `profile.ranks` (training/run/rank_tables.py: seconds per
step, min / median / max over the ranks). A record without them (one process, an eager window,
an older block) gets no lines.
"""

from __future__ import annotations

from .record_schema import Record, is_num, num
from .text import number, one_line, table


def _ms(secs: float, per: float = 1.0) -> str:
    return f"{secs * 1e3 / per:.3f}"


def comm_lines(prof: Record) -> list[str]:
    """Compute, communication, exposed communication and overlap per replayed step, then one
    line per collective op (longest first)."""
    s = prof.get("sampling") if isinstance(prof.get("sampling"), dict) else {}
    c = s.get("comm")
    if not isinstance(c, dict) or not is_num(c.get("replays")) or c["replays"] <= 0:
        return []
    n = float(c["replays"])
    overlap = c.get("overlap_pct")
    lines = [
        f"Communication in the replayed step (kernel records of both streams, mean of "
        f"{int(n)} sampled replays): compute {_ms(num(c.get('compute_s')), n)} ms, "
        f"communication {_ms(num(c.get('comm_s')), n)} ms, exposed communication "
        f"{_ms(num(c.get('exposed_s')), n)} ms (only collectives running), overlap "
        f"{number(overlap, '.1f', '%')} of the communication hidden behind compute",
    ]
    ops = [op for op in prof.get("ops") or [] if isinstance(op, dict)]
    if ops:  # attribution's check: one stream's compute kernels hardly overlap each other
        own = sum(num(op.get("time_s")) for op in ops if op.get("category") != "comm")
        compute = num(c.get("compute_s"))
        drift = f", {100.0 * (own - compute) / compute:+.2f}% of it" if compute > 0 else ""
        lines.append(f"Check: the other ops' times sum to {_ms(own, n)} ms/step against the "
                     f"compute time{drift} (the non-collective ops' kernel times, summed: "
                     "kernels that overlap one another count twice)")
    rows = [[one_line(op.get("name")), one_line(op.get("phase")),
             _ms(num(op.get("union_s")), n), _ms(num(op.get("exposed_s")), n),
             "second" if op.get("side_stream") else "step's"]
            for op in c.get("ops") or [] if isinstance(op, dict)]
    if rows:
        lines += table(["Collective", "Phase", "ms/step", "Exposed ms/step", "Stream"], rows,
                       right={2, 3})
    return lines


def rank_lines(prof: Record, top: int = 5) -> list[str]:
    """The top ops as min / median / max over the ranks, and the straggler line."""
    ranks = prof.get("ranks")
    if not isinstance(ranks, dict) or not isinstance(ranks.get("straggler"), dict):
        return []
    ops = [op for op in ranks.get("ops") or [] if isinstance(op, dict)][:top]
    rows = [[one_line(op.get("name")), one_line(op.get("phase")), _ms(num(op.get("min_s"))),
             _ms(num(op.get("median_s"))), _ms(num(op.get("max_s")))] for op in ops]
    lines = [f"Top {len(rows)} ops over {number(ranks.get('count'), ',')} ranks (ms/step):",
             *table(["Op", "Phase", "Min", "Median", "Max"], rows, right={2, 3, 4})]
    st = ranks["straggler"]
    step, median = num(st.get("step_s")), num(st.get("median_step_s"))
    excess = f" ({100.0 * (step / median - 1.0):+.1f}%)" if median > 0 else ""
    line = (f"Straggler: rank {one_line(st.get('rank'))}'s step {_ms(step)} ms against the "
            f"median {_ms(median)} ms{excess}")
    if is_num(st.get("compute_s")):
        line += (f"; its compute {_ms(num(st.get('compute_s')))} ms against the median "
                 f"{_ms(num(st.get('median_compute_s')))} ms")
    return [*lines, line]
