"""`rustyflow` held at a pause point: the fault tests start a run through this, which injects
the pause points (training/run/hooks.py) that a real run never has.

    python tests/paused_cli.py POINT[:N] MARKER COMMAND [ARGS...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from rustyflow_py.cli import main
from rustyflow_py.training.run.hooks import PausePoints, pausing

if __name__ == "__main__":
    spec, marker, *args = sys.argv[1:]
    with pausing(PausePoints.parse(spec, Path(marker))):
        main(args)
