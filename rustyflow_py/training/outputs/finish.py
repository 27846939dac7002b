"""The end of a run: its checkpoint, run record, log block, console summary and trace.

Rank 0 writes; the other processes of a data-parallel run only take part in gathering a
sharded optimizer's state for the checkpoint. A write that fails goes to a named fallback
(writing.write_with_fallback) and fails the run; so does a lost log block, whatever its status
was.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ...engine.profiler import Profiler
from ...errors import TrainingError
from ...reporting import logfile
from ...reporting.log_writer import format_block
from ...reporting.record_schema import RunRecord
from ...reporting.run_text import format_summary
from ...reporting.trace import chrome_trace, graph_trace
from ..run import hooks
from ..run.parts import RunParts, Say
from ..run.rank_tables import gather_figures
from ..run.state import LoopState
from . import guard, writing
from .record import build_record

Outcome = tuple[str, str | None]  # the run's final status and message


def finish(parts: RunParts, state: LoopState, save: Callable[[], str | None], status: str,
           message: str | None, train_time: float) -> tuple[RunRecord | None, Outcome]:
    """Checkpoint (not after a divergence, through `save`, the loop's), trace, record, log
    block, console summary (rank 0; the others only take part in gathering a sharded
    optimizer's state) of the run of `parts` whose loop has ended with `status` and
    `state`. Returns the record (None on the other processes) and the run's final status and
    message: weights that are not finite, or an output that was lost or went to a fallback,
    make it a failure; a stop signal during the writes an interruption
    (guard.final_status)."""
    ckpt = None
    if status != "failed":
        try:
            ckpt = save()
        except TrainingError as exc:  # weights not finite: nothing was written
            status, message = "failed", str(exc)
    lost, rescued = list(parts.checkpoints.lost), list(parts.checkpoints.rescued)
    if parts.world.main and parts.trace and parts.profiler is not None:
        trace = write_trace(parts.trace, parts.profiler, parts.backend, parts.device,
                            parts.say, parts.warn)
        if trace.place is None:
            lost.append("trace")
        elif trace.rescued is not None:
            rescued.append(f"the trace {trace.rescued}")
    status, message = outcome = guard.final_status(status, message, lost, rescued,
                                                   parts.signals.requested)
    # every rank's figures at rank 0: a collective, so not after a failure, which may be this
    # rank's alone (the others are then waiting in the step, and the failure ends the job)
    ranks = gather_figures(parts) if status != "failed" else None
    if not parts.world.main:
        return None, outcome
    planned = parts.cfg.log_file
    records = {planned: build_record(parts, state, status, message, train_time, ckpt, ranks)}

    def append(path: str) -> None:
        """The block at `path`; at a fallback it says that it is one, and the run failed."""
        if path not in records:
            note = f"the log block could not be appended to {planned}, so it is here"
            records[path] = build_record(parts, state, "failed", f"{message}; {note}"
                                         if message else note, train_time, ckpt, ranks)
        hooks.pause("log-append")
        logfile.append_block(path, format_block(records[path]))

    log = writing.write_with_fallback(planned, append, "log block", parts.warn,
                                      name="training_log.txt")
    record = records.get(log.place or planned, records[planned])
    parts.say(format_summary(record, log.place))
    if log.place is None:
        outcome = "failed", f"the log block of this {status} run is lost (see above)"
    elif log.rescued is not None:
        what = f"the log block {log.rescued}"
        outcome = "failed", f"{message}; {what}" if message else what
    elif parts.signals.requested is not None and status != "interrupted":
        # the block was written as the run ended; the exit status will report the signal
        parts.say(f"A stop request arrived while the log block was written: the run had "
                  f"ended {status} (as logged); exiting with the signal's status")
    return record, outcome


def write_trace(path: str, prof: Profiler, backend: Any, device: str, say: Say,
                warn: Say) -> writing.Written:
    """The profiled steps' timeline as a Chrome trace (also after an interrupted run): a
    graph profile's first sampled replay, else the first profiled steps."""
    if prof.graph is not None and prof.graph.first:
        doc = graph_trace(prof.graph.first, prof.graph.first_step, device=device,
                          hardware=backend.hardware(), replays=prof.graph.replays)
    else:
        doc = chrome_trace(prof.spans, prof.step_numbers, gpu=backend.kind == "gpu",
                           device=device, hardware=backend.hardware(),
                           profiled_steps=prof.steps)
    data = json.dumps(doc, separators=(",", ":")).encode()
    written = writing.write_with_fallback(
        str(path), lambda p: writing.write_atomically(p, lambda f: f.write(data)), "trace", warn)
    where = written.place
    if where:
        traced = 1 if prof.graph is not None and prof.graph.first else len(prof.step_numbers)
        say(f"Trace of {traced} profiled step{'s' if traced != 1 else ''}: {where} (open it in "
            "ui.perfetto.dev or chrome://tracing)")
    return written
