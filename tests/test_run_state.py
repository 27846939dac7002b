"""A run's state is scoped, never process-wide: the grad mode, the profiler and the transfer
rules live in the context of the block that set them; a device keeps no view per policy it
has seen; the step runner hands the model its step's randomness instead of rewriting the
model's; and the fault tests' pause points are an object injected for a block."""

from __future__ import annotations

import dataclasses
import gc
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

from rustyflow_py.engine.backend import TransferStats, counting_transfers
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.policy import RunPolicy
from rustyflow_py.engine.precision import Precision
from rustyflow_py.engine.profiler import Profiler
from rustyflow_py.engine.tensor import Tensor, grad_enabled, no_grad
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.model.optim import AdamW, Schedule
from rustyflow_py.training.run import hooks
from rustyflow_py.training.run.step import StepRunner


def in_thread(fn: object) -> object:
    """What `fn()` returns when called in a thread of its own."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(fn()))  # type: ignore[operator]
    thread.start()
    thread.join()
    return out[0]


def test_no_grad_is_the_blocks_own() -> None:
    """Another thread keeps recording the graph while this one is inside no_grad()."""
    x = Tensor(np.ones(3, np.float32), requires_grad=True)
    with no_grad():
        assert not grad_enabled() and not (x * 2.0).requires_grad
        assert in_thread(grad_enabled) is True
    assert grad_enabled() and (x * 2.0).requires_grad


def test_a_profiler_sees_only_the_ops_of_its_block() -> None:
    x = Tensor(np.ones(3, np.float32))
    prof = Profiler(get_backend("cpu"))
    with prof:
        _ = x + x
        in_thread(lambda: x * x)  # another thread's op: not this block's
        with prof:  # re-entered (as each profiled step does): still attached after
            _ = x + x
        _ = x + x
    _ = x + x  # after the block: not recorded
    assert {k[0]: int(v[0]) for k, v in prof.stats.items()} == {"add": 3}


def test_transfer_counting_is_scoped_to_its_block() -> None:
    stats = TransferStats()
    stats.add("host->device", 8)
    stats.add("device->host", 4)
    assert stats.snapshot() == {"h2d_count": 1, "h2d_bytes": 8, "d2h_count": 1,
                                "d2h_bytes": 4}
    with counting_transfers() as outer:
        with counting_transfers() as inner:
            pass
        # nothing process-wide is left to read: each block has its own counts
        assert outer.snapshot() == inner.snapshot() == TransferStats().snapshot()


def test_a_view_nothing_holds_is_dropped() -> None:
    """The device keeps a view per policy only while something uses it (a run, its tensors):
    many runs with many policies leave no trail of views behind."""
    policy = dataclasses.replace(RunPolicy(Precision.of("fp32")), threads=7, cpu_jit="off")
    view = get_backend("cpu", policy)
    t = Tensor(np.ones(2, np.float32), device=view)
    del view
    gc.collect()
    assert get_backend("cpu", policy) is t.backend  # alive through its tensor: one view
    gone = weakref.ref(t.backend)
    del t
    gc.collect()
    assert gone() is None


def test_the_step_runner_leaves_the_models_randomness_alone() -> None:
    cfg = GPTConfig(vocab_size=50, seq_len=8, n_layer=1, n_head=2, n_embd=16, dropout=0.2)
    model = GPT(cfg, "cpu", seed=1)
    own = model.rng
    opt = AdamW(model.buffer, Schedule(1e-3, 1, 10, 0.1))
    stream = np.random.default_rng(0).integers(0, 50, (2, 40)).astype(np.int32)
    runner = StepRunner(model, opt, stream, 8, log_interval=2, profiler=None, profile_steps=0,
                        graph=False, warn=print)
    runner.run(0)
    runner.run(1)
    assert model.rng is own and int(own.step) == 0
    assert [r.step is opt.step_count for r in runner.rngs] == [True]  # the optimizer's
    assert int(opt.step_count) == 2


def test_pause_points_act_only_inside_the_block_that_injected_them(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    points = hooks.PausePoints.parse("evaluation:2", marker)
    hooks.pause("evaluation")  # no block: a real run's call does nothing
    with hooks.pausing(points):
        hooks.pause("log-append")
        hooks.pause("evaluation")
        assert points.reached == 1 and not marker.exists()
    hooks.pause("evaluation")
    assert points.reached == 1



def test_a_cpu_view_for_another_policy_does_not_look_for_blas_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The device pins BLAS to one thread once; a view bound to a run's policy shares that
    (threadpoolctl scans every loaded library each time it is asked)."""
    from rustyflow_py.engine.ops import cpu_pool

    looked: list[int] = []
    real = cpu_pool._blas_threads_setter
    monkeypatch.setattr(cpu_pool, "_blas_threads_setter", lambda: looked.append(1) or real())
    device = get_backend("cpu")
    view = device.bound(RunPolicy(threads=3))
    assert looked == []
    assert view.kernels._set_blas_threads is device.kernels._set_blas_threads
    assert view.kernels.threads == 3
