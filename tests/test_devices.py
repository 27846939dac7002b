"""Devices are instances: cpu, gpu (= gpu:0) and gpu:N, each with its own backend, stream and
transfer counters; a DEVICE of any of those forms is valid configuration."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import DEVICES

from rustyflow_py.engine.backend import (
    counting_transfers,
    device_name,
    parse_device,
    resolve_device,
)
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.tensor import Tensor
from rustyflow_py.errors import ConfigError, DeviceError
from rustyflow_py.training.config.config import Config


@pytest.mark.parametrize(("name", "parsed", "canonical"), [
    ("cpu", ("cpu", 0), "cpu"), ("gpu", ("gpu", 0), "gpu"), ("gpu:0", ("gpu", 0), "gpu"),
    ("gpu:3", ("gpu", 3), "gpu:3"),
])
def test_device_names_parse_to_a_kind_and_an_index(
    name: str, parsed: tuple[str, int], canonical: str,
) -> None:
    assert parse_device(name) == parsed
    assert device_name(*parsed) == canonical


@pytest.mark.parametrize("name", ["tpu", "gpu:", "gpu:x", "cpu:1", "GPU"])
def test_unknown_device_names_are_a_clear_error(name: str) -> None:
    with pytest.raises(DeviceError, match="expected cpu, gpu .* or gpu:N"):
        parse_device(name)


@pytest.mark.parametrize("device", DEVICES)
def test_each_instance_has_one_backend_with_its_own_counters(device: str) -> None:
    backend = get_backend(device)
    assert get_backend(f"{device}:0" if device == "gpu" else device) is backend
    assert backend.name == device and backend.kind == device
    backend.transfers.reset()
    with counting_transfers() as seen:
        t = Tensor(np.arange(4, dtype=np.float32), device=device)
        t.numpy()
    expected = 0 if device == "cpu" else 1  # the CPU's arrays are already on the host
    assert (backend.transfers.h2d_count, backend.transfers.d2h_count) == (expected, expected)
    assert seen.snapshot() == backend.transfers.snapshot()  # one device in use


def test_a_missing_gpu_index_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu:64 on a machine with two GPUs: the fallback's reason names the index and the count,
    whether or not this machine has CuPy or a GPU (a stand-in CuPy reports two devices)."""
    runtime = SimpleNamespace(getDeviceCount=lambda: 2)
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    monkeypatch.delenv("RUSTYFLOW_DISABLE_GPU", raising=False)
    warnings: list[str] = []
    used, reason = resolve_device("gpu:64", False, lambda _: None, warnings.append)
    assert (used, reason) == ("cpu", "no CUDA device 64 (this machine has 2)")
    assert warnings and reason in warnings[0]
    with pytest.raises(DeviceError, match=r"--device gpu:64: no CUDA device 64 \(this machine"):
        resolve_device("gpu:64", True, lambda _: None, lambda _: None)


def test_device_key_accepts_instances_and_the_checkpoint_names_the_kind() -> None:
    cfg = Config(device="gpu:1", model_path="models/m.npz")
    assert cfg.device == "gpu:1"
    assert cfg.model_path_for("gpu:1") == "models/m-gpu.npz"
    with pytest.raises(ConfigError, match="DEVICE='gpu1' is not valid: expected one of auto, "
                                          "cpu, gpu, or gpu:N"):
        Config(device="gpu1")


def test_nesterov_without_momentum_is_a_config_error_before_any_work() -> None:
    with pytest.raises(ConfigError, match="NESTEROV=true .* needs MOMENTUM > 0"):
        Config(optimizer="sgd", nesterov=True, momentum=0.0)
    with pytest.raises(ConfigError, match="NESTEROV=true .* applies only to OPTIMIZER=sgd"):
        Config(optimizer="adamw", nesterov=True, momentum=0.0)  # adamw would ignore it
