"""What the loop learns as it runs, beside the history its checkpoints keep (start/resume.py):
the run record reads both."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class LoopState:
    """The loop's own state: none of it is saved, a resumed run starts it afresh."""

    start_step: int  # this process's steps are counted from here (a resume's checkpoint step)
    val_step: int = -1  # the step at which the history's val_ppl was measured
    test_ppl: float | None = None
    test_ppl_of: str | None = None  # which weights test_ppl measured
    early_stopped: str = ""  # why the run stopped early, once it has
