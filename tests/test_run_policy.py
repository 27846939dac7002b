"""The frozen run policy (engine/policy.py): two runs with different policies in one process
do not affect each other, and nothing a run chooses is left on the shared device.

Each isolation test runs policy A, then B, then A again, and holds the second A run to the
first bit for bit; where B computes differently (TF32, the numba kernels) it also checks that
B really did, so the test cannot pass by B silently running A's policy. The GPU variants skip
cleanly without CuPy or a GPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from helpers import make_cfg, quiet

from rustyflow_py.engine.backend import DeviceError, gpu_unavailable_reason
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.ops import table
from rustyflow_py.engine.policy import DEFAULT, RunPolicy
from rustyflow_py.engine.precision import Precision
from rustyflow_py.engine.tensor import Tensor
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.model.optim import AdamW, Schedule
from rustyflow_py.training.evaluation import evaluate
from rustyflow_py.training.run.loop import Trainer

_GPU_REASON = gpu_unavailable_reason()
needs_gpu = pytest.mark.skipif(_GPU_REASON is not None, reason=str(_GPU_REASON))
needs_numba = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                 reason="numba is not installed")
# attention dropout and residual dropout on, so the Philox masks are part of what must repeat
CFG = GPTConfig(97, 16, 2, 2, 32, dropout=0.1)


def fp32(**changes: object) -> RunPolicy:
    return dataclasses.replace(RunPolicy(Precision.of("fp32")), **changes)


def train(device: str, policy: RunPolicy, steps: int = 4) -> tuple[list[float], np.ndarray]:
    """A few AdamW steps of a small GPT on `device` under `policy`: the losses and the final
    weights, as host arrays."""
    backend = get_backend(device, policy)
    p = policy.precision
    model = GPT(CFG, backend, seed=3, dtype=p.storage,
                compute=p.compute if backend.kind == "gpu" else None)
    opt = AdamW(model.buffer, Schedule(3e-3, 1, 10, 0.1), grad_clip=1.0)
    rng = np.random.default_rng(0)
    # no token twice in the input: the GPU's embedding scatter-add sums repeats with atomics,
    # whose order (and so whose last bit) may change from run to run
    x = Tensor(rng.permutation(97)[:64].reshape(4, 16), device=backend)
    y = Tensor(rng.integers(0, 97, (4, 16)), device=backend)
    losses = []
    for _ in range(steps):
        model.buffer.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    return losses, backend.to_host(model.buffer.flat)


def assert_isolated(device: str, a: RunPolicy, b: RunPolicy, b_differs: bool) -> None:
    """A, then B, then A again: the second A run is the first bit for bit."""
    first = train(device, a)
    other = train(device, b)
    again = train(device, a)
    assert again[0] == first[0]
    np.testing.assert_array_equal(again[1], first[1])
    if b_differs:  # B's policy took effect in B's run (and only there)
        assert not np.array_equal(other[1], first[1])


# ---- the object ----------------------------------------------------------------------------
def test_a_policy_is_frozen_and_names_its_view_of_the_device() -> None:
    policy = fp32(threads=1, cpu_jit="off")
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.threads = 2  # type: ignore[misc]
    view = get_backend("cpu", policy)
    assert get_backend("cpu", fp32(threads=1, cpu_jit="off")) is view  # one view per policy
    shared = get_backend("cpu")
    assert view is not shared and shared.policy == DEFAULT
    assert view.xp is shared.xp and view.transfers is shared.transfers  # one device
    assert (view.kernels.threads, view.kernels.jit) == (1, None)


def test_no_setter_is_left_on_a_backend_or_its_kernels() -> None:
    backend = get_backend("cpu")
    for name in ("set_precision", "configure"):
        assert not hasattr(backend, name)
    for name in ("set_attention", "set_threads", "set_jit"):
        assert not hasattr(backend.kernels, name)


def test_a_run_leaves_the_shared_cpu_backend_as_it_was() -> None:
    shared = get_backend("cpu")
    before = (shared.kernels.threads, shared.kernels.jit, shared.kernels.attention)
    train("cpu", fp32(threads=1, cpu_jit="off", attention="materialized"), steps=1)
    assert (shared.kernels.threads, shared.kernels.jit, shared.kernels.attention) == before


def test_the_kernel_table_runs_a_views_kernels_with_the_views_policy() -> None:
    """The table's family instances belong to one kernel set: a view's families (made after
    the device's own were used) read the view's policy, and the device's keep theirs."""
    shared, view = get_backend("cpu"), get_backend("cpu", fp32(threads=1, cpu_jit="off"))
    x = np.ones((8, 8), np.float32)
    np.testing.assert_array_equal(view.kernels.matmul(x, x), shared.kernels.matmul(x, x))
    gemm = table.lookup("matmul", "cpu", "float32")
    mine, theirs = view.kernels.family(gemm), shared.kernels.family(gemm)
    assert mine is not theirs
    assert (mine.threads, mine.backend.policy) == (1, view.policy)
    assert (theirs.threads, theirs.backend.policy) == (shared.kernels.threads, DEFAULT)
    gelu = table.lookup("gelu_forward", "cpu", "float32")
    assert view.kernels.family(gelu).jit is None  # what a family takes comes from its view


def test_tensors_of_two_policies_do_not_mix_silently() -> None:
    a = Tensor(np.ones(3, np.float32), device=get_backend("cpu", fp32(threads=1)))
    b = Tensor(np.ones(3, np.float32), device=get_backend("cpu", fp32(threads=2)))
    with pytest.raises(DeviceError, match="two runs on cpu.*different run policies"):
        _ = a + b


# ---- isolation on the CPU --------------------------------------------------------------------
def test_cpu_threads_do_not_leak_between_runs() -> None:
    assert_isolated("cpu", fp32(threads=1, cpu_jit="off"), fp32(threads=2, cpu_jit="off"),
                    b_differs=False)


@needs_numba
def test_cpu_jit_does_not_leak_between_runs() -> None:
    assert_isolated("cpu", fp32(cpu_jit="off"), fp32(cpu_jit="on"), b_differs=True)


def test_an_fp64_run_between_two_fp32_runs_changes_nothing() -> None:
    assert_isolated("cpu", fp32(), RunPolicy(Precision.of("fp64")), b_differs=True)


def test_an_eval_after_a_train_does_not_inherit_its_settings(tiny_dir: Path) -> None:
    """A run with THREADS=1 CPU_JIT=off, then its checkpoint loaded for evaluation: the
    evaluation computes with this machine's defaults, not the run's."""
    trainer = Trainer(make_cfg(MAX_STEPS=2, THREADS=1, CPU_JIT="off"), quiet)
    assert trainer.run()["status"] == "completed"
    assert (trainer.backend.kernels.threads, trainer.backend.kernels.jit) == (1, None)
    model, _, _ = evaluate.load_model(trainer.cfg.model_path_for("cpu"), "cpu")
    loaded = model.buffer.backend
    assert loaded.policy == dataclasses.replace(DEFAULT, precision=Precision.of("fp32"))
    assert loaded.kernels.threads == get_backend("cpu").kernels.threads


# ---- isolation on the GPU --------------------------------------------------------------------
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("other", [
    pytest.param(RunPolicy(Precision.of("tf32")), id="tf32"),
    pytest.param(RunPolicy(Precision.of("bf16")), id="bf16"),
    pytest.param(RunPolicy(Precision.of("tf32"), attention="materialized", epilogues=False),
                 id="tf32-unfused"),
])
def test_gpu_runs_with_other_policies_do_not_change_an_fp32_run(other: RunPolicy) -> None:
    assert_isolated("gpu", fp32(), other, b_differs=True)


@pytest.mark.gpu
@needs_gpu
def test_a_tf32_trainer_leaves_the_default_gpu_backend_in_fp32(tiny_dir: Path) -> None:
    """The bug this design removes: a TF32 run used to leave TF32 on for everything after it
    in the process (an evaluation, the next test)."""
    before = train("gpu", DEFAULT)
    trainer = Trainer(make_cfg(MAX_STEPS=2, DEVICE="gpu", PRECISION="tf32"), quiet)
    assert trainer.run()["status"] == "completed"
    assert trainer.backend.kernels.cublas.matmul_compute == "tf32"
    assert get_backend("gpu").kernels.cublas.matmul_compute == "fp32"
    after = train("gpu", DEFAULT)
    assert after[0] == before[0]
    np.testing.assert_array_equal(after[1], before[1])
