"""The end of a run: its checkpoint, run record, log block, console summary and trace.

Rank 0 writes; the other processes of a data-parallel run only take part in gathering a
sharded optimizer's state for the checkpoint. A write that fails goes to a named fallback
(outputs.write_with_fallback) and fails the run; so does a lost log block, whatever its status
was.
"""

from __future__ import annotations

import json
from typing import Any

from ..engine.profiler import Profiler
from ..errors import TrainingError
from ..reporting import logfile
from ..reporting.log_writer import format_block
from ..reporting.record_schema import RunRecord
from ..reporting.run_text import format_summary
from ..reporting.trace import chrome_trace, graph_trace
from . import guard, hooks, outputs
from .rank_tables import gather_figures
from .record import build_record
from .run_parts import Say

Outcome = tuple[str, str | None]  # the run's final status and message


def finish(run: Any, status: str, message: str | None,
           train_time: float) -> tuple[RunRecord | None, Outcome]:
    """Checkpoint (not after a divergence), trace, record, log block, console summary (rank 0;
    the others only take part in gathering a sharded optimizer's state) of `run`, a
    loop.Trainer whose loop has ended with `status`. Returns the record (None on the other
    processes) and the run's final status and message: weights that are not finite, or an
    output that was lost or went to a fallback, make it a failure; a stop signal during the
    writes an interruption (guard.final_status)."""
    ckpt = None
    if status != "failed":
        try:
            ckpt = run.save()
        except TrainingError as exc:  # weights not finite: nothing was written
            status, message = "failed", str(exc)
    lost, rescued = list(run.checkpoints.lost), list(run.checkpoints.rescued)
    if run.world.main and run.trace and run.profiler is not None:
        trace = write_trace(run.trace, run.profiler, run.backend, run.device, run.say,
                            run.warn)
        if trace.place is None:
            lost.append("trace")
        elif trace.rescued is not None:
            rescued.append(f"the trace {trace.rescued}")
    status, message = outcome = guard.final_status(status, message, lost, rescued,
                                                   run.signals.requested)
    ranks = gather_figures(run)  # every rank's figures, at rank 0 (a collective)
    if not run.world.main:
        return None, outcome
    planned = run.cfg.log_file
    records = {planned: build_record(run, status, message, train_time, ckpt, ranks)}

    def append(path: str) -> None:
        """The block at `path`; at a fallback it says that it is one, and the run failed."""
        if path not in records:
            note = f"the log block could not be appended to {planned}, so it is here"
            records[path] = build_record(run, "failed", f"{message}; {note}" if message
                                         else note, train_time, ckpt, ranks)
        hooks.pause("log-append")
        logfile.append_block(path, format_block(records[path]))

    log = outputs.write_with_fallback(planned, append, "log block", run.warn,
                                      name="training_log.txt")
    record = records.get(log.place or planned, records[planned])
    run.say(format_summary(record, log.place))
    if log.place is None:
        outcome = "failed", f"the log block of this {status} run is lost (see above)"
    elif log.rescued is not None:
        what = f"the log block {log.rescued}"
        outcome = "failed", f"{message}; {what}" if message else what
    elif run.signals.requested is not None and status != "interrupted":
        # the block was written as the run ended; the exit status will report the signal
        run.say(f"A stop request arrived while the log block was written: the run had "
                f"ended {status} (as logged); exiting with the signal's status")
    return record, outcome


def write_trace(path: str, prof: Profiler, backend: Any, device: str, say: Say,
                warn: Say) -> outputs.Written:
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
    written = outputs.write_with_fallback(
        str(path), lambda p: outputs.write_atomically(p, lambda f: f.write(data)), "trace", warn)
    where = written.place
    if where:
        traced = 1 if prof.graph is not None and prof.graph.first else len(prof.step_numbers)
        say(f"Trace of {traced} profiled step{'s' if traced != 1 else ''}: {where} (open it in "
            "ui.perfetto.dev or chrome://tracing)")
    return written
