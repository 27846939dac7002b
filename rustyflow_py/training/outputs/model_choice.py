"""Which checkpoint `generate` and `chat` load when `--model` is not given: the model of the
latest completed run in the log, the way `git` and nanoGPT's `sample.py` take the last thing
made in this folder, so that chatting right after any training run needs no argument.

The rule, in order:
1. `--model PATH`: that file (or, for `foo.npz` that does not exist, the `foo-cpu.npz` or
   `foo-gpu.npz` beside it that does, saying so).
2. The latest run of the config's log (LOG_FILE, default training_log.txt) whose status is
   `completed` and whose checkpoint is still on disk: its best checkpoint (best validation
   perplexity) when that file exists, else its final one. When a config was named (`--config`,
   the chat scripts' CONFIG), only that config's runs count: those whose checkpoint is its
   MODEL_PATH.
3. The config's MODEL_PATH with -cpu/-gpu (the requested device's first), as `train` writes it.

Anything but the first is announced in one `Model: ...` line, so the user sees which model
answers; when nothing is found, the error names the checkpoints that do exist, to pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ...reporting.log_parser import read_log
from ...reporting.record_schema import Record
from ..config.config import Config, tagged
from .checkpoint import CheckpointError


def choose_model(given: str | None, config: str | None, cfg: Config,
                 say: Callable[[str], None], prompt_missing: bool = False) -> str:
    """The checkpoint to load for `--model given` (None: not given) under `cfg`, read from
    the config file `config` (None: none was named, ./config.env or the defaults);
    `prompt_missing` (generate without --prompt) is mentioned first when nothing is found."""
    if given is None:
        latest = _latest_completed(cfg, named=config is not None)
        if latest is not None:
            path, what = latest
            if not prompt_missing:  # else the command stops at once, for want of a prompt
                say(f"Model: {path} ({what}; --model picks another)")
            return path
    return _configured_checkpoint(given, cfg, say, prompt_missing)


def _latest_completed(cfg: Config, named: bool) -> tuple[str, str] | None:
    """(checkpoint, how it was chosen) of the latest completed run in cfg's log whose files
    are still there (only cfg's own runs when `named`); None when the log has none."""
    try:
        records = read_log(cfg.log_file)
    except OSError:  # no log yet (or an unreadable one): nothing trained here to take
        return None
    own = {os.path.abspath(cfg.model_path_for(d)) for d in ("cpu", "gpu")}
    for record in reversed(records):
        final = record.get("checkpoint")
        if record.get("status") != "completed" or not isinstance(final, str):
            continue
        if named and os.path.abspath(final) not in own:
            continue
        path = _existing(record)
        if path is not None:
            kind = "best" if path != final else "final"
            whose = "this config's" if named else "the"
            return path, (f"the {kind} checkpoint of {whose} latest completed run in "
                          f"{cfg.log_file}, {record.get('timestamp', 'at an unrecorded time')}")
    return None


def _existing(record: Record) -> str | None:
    """A run's best checkpoint when its file exists, else its final one when that does."""
    for key in ("best_checkpoint", "checkpoint"):
        path = record.get(key)
        if isinstance(path, str) and Path(path).is_file():
            return path
    return None


def _configured_checkpoint(given: str | None, cfg: Config, say: Callable[[str], None],
                           prompt_missing: bool) -> str:
    """`given`, or the one `rustyflow train` writes for `cfg` (MODEL_PATH with -gpu/-cpu,
    the requested device's first). Given `foo.npz` when only `foo-gpu.npz`/`foo-cpu.npz`
    exist, the one that exists is used, and `say` tells so."""
    order = ("cpu", "gpu") if cfg.device == "cpu" else ("gpu", "cpu")
    if given is not None:
        if Path(given).is_file():
            return given
        candidates = [tagged(given, d) for d in order]
    else:
        candidates = [cfg.model_path_for(d) for d in order]
    for path in candidates:
        if Path(path).is_file():
            say(f"note: {given} does not exist; using {path}" if given is not None else
                f"Model: {path} (MODEL_PATH of the config; {cfg.log_file} has no completed "
                f"run whose checkpoint is still there)")
            return path
    where = (f"--model {given} does not exist, nor does {' or '.join(candidates)}"
             if given is not None else
             f"no --model given, {cfg.log_file} has no completed run whose checkpoint is "
             f"still there, and there is no checkpoint at {' or '.join(candidates)} "
             f"(MODEL_PATH of the config)")
    raise CheckpointError(("generate needs --prompt TEXT; also, " if prompt_missing else "")
                          + where + _what_to_pass(Path(candidates[0]).parent))


def _what_to_pass(folder: Path) -> str:
    """The checkpoints that do exist where one was looked for, as the --model to pass; else
    how to make one."""
    train = "train one with ./train_cpu.sh or ./train_gpu.sh"
    if not folder.is_dir():
        return f": {train} ({folder}/ does not exist)"
    found = sorted(str(p) for p in folder.glob("*.npz"))
    if not found:
        return f": {train} ({folder}/ holds no .npz files)"
    return f": pass one with --model ({', '.join(found)}), or {train}"
