"""Helpers the training tests share (plain functions and constants; the fixtures that use
them, tiny_dir and workspace, are in conftest.py).

The tiny run: a 1-layer, 32-wide model on a few hundred lines of repetitive text (29 steps per
epoch), with its config TINY; the commands that train it in this process or as a subprocess;
and the fault harness's check that a command left every file it found intact.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from rustyflow_py.cli import main
from rustyflow_py.model.optim import AdamW
from rustyflow_py.model.params import ParameterBuffer
from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.training.config.config import KEYS, Config, load_config
from rustyflow_py.training.outputs import checkpoint
from rustyflow_py.training.outputs import writing as outputs
from rustyflow_py.training.run.loop import Trainer

REPO = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str | None = None, siblings: bool = False) -> ModuleType:
    """A script of benchmarks/ or scripts/ (those folders are no packages) as a module, loaded
    once per process and registered in sys.modules under `name` (its file's stem by default:
    dataclasses look their module up there). `siblings` puts its folder on sys.path first, for
    a script that imports its neighbours by name."""
    name = name or path.stem
    if name in sys.modules:
        return sys.modules[name]
    if siblings and str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
STEPS_PER_EPOCH = 29  # the tiny corpus below at BATCH_SIZE 4 x SEQ_LEN 16

# A memorisable corpus: 300 lines cycling through five overlapping 6-word windows.
_WORDS = "the cat sat on the mat and the dog ran to the park".split()
TINY_TEXT = "".join(" ".join(_WORDS[i % 5 : i % 5 + 6]) + "\n" for i in range(300))

TINY = {
    "DATASET": "tiny.txt",
    "SEQ_LEN": 16,
    "BATCH_SIZE": 4,
    "EMBED_DIM": 32,
    "NUM_HEADS": 2,
    "NUM_LAYERS": 1,
    "LEARNING_RATE": 1e-2,
    "WARMUP_STEPS": 5,
    "LOG_INTERVAL": 4,  # most stop points below fall mid-chunk: partial read-backs too
    "DEVICE": "cpu",
    "PROFILE": False,
    "LOG_FILE": "log.txt",
    "MODEL_PATH": "models/tiny.npz",
}

TRAIN = ("train", "--config", "tiny.env")
TRAINED = ("models/tiny-cpu.npz", "models/tiny-cpu-best.npz")


def env_file(values: dict[str, Any]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


def make_cfg(**changes: Any) -> Config:
    """TINY with `changes`; MODEL_PATH as a config file gives it (the trainer adds -cpu, as
    for `train --config tiny.env`), not as a --model-path typed on the command line."""
    values = {**TINY, **changes}
    model_path = str(values.pop("MODEL_PATH"))
    cfg, warnings = load_config(None, values, environ={"MODEL_PATH": model_path})
    assert warnings == []
    return cfg


def quiet(_: str) -> None:
    """A `say` that drops the trainer's console output."""


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def one_error(result: Any) -> str:
    """The stderr of a command that failed as a user's mistake should: exit status 1 and one
    line, never a traceback or a usage block (`result`: invoke's, or a subprocess's)."""
    status = result.exit_code if hasattr(result, "exit_code") else result.returncode
    lines = result.stderr.splitlines()
    assert status == 1 and len(lines) == 1, (status, lines)
    return lines[0]


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for `python -m rustyflow_py` and the scripts: this checkout's package."""
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {**env, **extra}


def log_records(path: str | Path = "log.txt") -> list[dict[str, Any]]:
    warnings: list[str] = []
    records = read_log(path, warnings)
    assert warnings == []
    return records


def interrupt_in_step(trainer: Trainer, step: int, signum: int = signal.SIGINT) -> None:
    """Deliver a real `signum` to this process while the trainer runs step number `step`."""
    real_run = trainer.runner.run

    def run(done: int) -> None:
        if done + 1 == step:
            os.kill(os.getpid(), signum)
        real_run(done)

    trainer.runner.run = run  # type: ignore[method-assign]


def run_interrupted(cfg: Config, stop_after: int, resume: str | None = None,
                    say: Callable[[str], None] | None = None,
                    signum: int = signal.SIGINT) -> Trainer:
    """Train until a stop signal arrives inside step `stop_after`: the trainer finishes that
    step, writes its checkpoint and log block, and raises KeyboardInterrupt. (It replaces
    whatever an earlier run of the test left at its checkpoint: `overwrite`.)"""
    trainer = Trainer(cfg, say or quiet, resume=resume, overwrite=True)
    interrupt_in_step(trainer, stop_after, signum)
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    return trainer


class Lines:
    """The lines a subprocess prints, read as they come by a thread (so a wait is bounded)."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self.new: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line)
            self.new.put(line)

    def wait_for(self, pattern: str, timeout: float = 60) -> None:
        """Block until a line matching `pattern` comes (AssertionError after `timeout` s of
        silence)."""
        while True:
            try:
                line = self.new.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} within {timeout}s") from None
            if re.search(pattern, line):
                return

    def text(self) -> str:
        return "".join(self.lines)


def signal_the_command(tiny_dir: Path, signum: int) -> int:
    """Run `rustyflow train` in a subprocess, send `signum` once epoch 2 has started, and
    return its exit status."""
    (tiny_dir / "tiny.env").write_text(env_file({**TINY, "NUM_EPOCHS": 1000}))
    cmd = [sys.executable, "-m", "rustyflow_py", "train", "--config", "tiny.env"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        Lines(proc.stderr).wait_for(r"^epoch 2/1000", timeout=60)
        proc.send_signal(signum)
        return proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()


def poison_weights_after(monkeypatch: pytest.MonkeyPatch, updates: int,
                         value: float = np.nan) -> None:
    """After the optimizer's `updates`-th step, set every weight to `value` (NaN: the next loss
    is NaN; a huge value: the next forward overflows)."""
    real_step = AdamW.step
    calls = 0

    def step(self: AdamW) -> None:
        nonlocal calls
        real_step(self)
        calls += 1
        if calls == updates:
            self.buffer.flat[...] = value

    monkeypatch.setattr(AdamW, "step", step)


# ------------------------------------------------------------------------------ faults

Patch = Callable[[pytest.MonkeyPatch], None]


def disk_full(prefix: str = "") -> Patch:
    """Every checkpoint write under `prefix` (all, by default) fails: ENOSPC."""
    def patch(mp: pytest.MonkeyPatch) -> None:
        real = checkpoint.save

        def save(path: str, *args: object, **kw: object) -> Path:
            if str(path).startswith(prefix):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(path, *args, **kw)  # type: ignore[arg-type]
        mp.setattr(checkpoint, "save", save)
    return patch


def no_fallbacks(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(outputs, "fallbacks", lambda path, name=None: [])


def nan_in_saved_weights(value: float = np.nan) -> Patch:
    """The weights handed to the saver hold `value` (in wte), while the loss stays finite."""
    def patch(mp: pytest.MonkeyPatch) -> None:
        real = ParameterBuffer.state_dict

        def state_dict(self: ParameterBuffer) -> dict[str, np.ndarray]:
            weights = real(self)
            weights["wte"].flat[0] = value
            return weights
        mp.setattr(ParameterBuffer, "state_dict", state_dict)
    return patch


def nan_validation(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(Trainer, "evaluate", lambda self, split: float("nan"))


def combine(*patches: Patch) -> Patch:
    def patch(mp: pytest.MonkeyPatch) -> None:
        for p in patches:
            p(mp)
    return patch


# ------------------------------------------------------------------------------ intact files


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (relative path -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def assert_intact(before: dict[str, bytes], after: dict[str, bytes],
                  replaced: tuple[str, ...] = ()) -> None:
    """Every file of `before` is unchanged in `after`, but `replaced` ones; logs only grew."""
    for name, data in before.items():
        if name in replaced:
            continue
        assert name in after, f"{name} was removed"
        if name.endswith("log.txt"):
            assert after[name].startswith(data), f"{name} was rewritten, not appended to"
        else:
            assert after[name] == data, f"{name} was changed"


def spy_fp8_gemms(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every FP8 GEMM a PRECISION=fp8 backend runs from here on, as
    "kind:gradient:when": kind linear or matmul, gradient the operand named as one (None
    for a forward product), when "captured" (inside a CUDA graph capture) or "eager". A call
    that fell back to bf16 raised and is not recorded."""
    from rustyflow_py.engine.ops.gemm.fp8 import Fp8Gemms

    calls: list[str] = []
    for name in ("matmul", "linear"):
        real = getattr(Fp8Gemms, name)

        def spy(self: Any, *args: Any, _real: Any = real, _name: str = name,
                **kwargs: Any) -> Any:
            out = _real(self, *args, **kwargs)
            when = "captured" if self._lt().stream.is_capturing() else "eager"
            calls.append(f"{_name}:{kwargs.get('gradient')}:{when}")
            return out

        monkeypatch.setattr(Fp8Gemms, name, spy)
    return calls
