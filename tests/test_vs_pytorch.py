"""benchmarks/vs_pytorch.py's GPT-2 peer, without timing anything: the MFU count against a
hand calculation, the peak lookup, the options, the report's rows, the kernel list's layout,
and a tiny shape run end to end (the CPU rows here; the graph row and its kernel list on a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from conftest import DEVICES
from helpers import load_script

from rustyflow_py.engine.cupti_trace import CuptiUnavailable
from rustyflow_py.engine.kernel_records import KernelAttribution, KernelRecord
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.policy import RunPolicy
from rustyflow_py.engine.precision import Precision
from rustyflow_py.model.gpt import GPTConfig, init_weights

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
H100 = "NVIDIA H100 80GB HBM3"
TINY = (1, 2, 16, 8, 2)  # layers, heads, embed, seq_len, batch


def _load(name: str) -> ModuleType:
    """A benchmarks/ script by name (vs_pytorch imports its siblings by their names, so they
    are the same modules here)."""
    return load_script(BENCH / f"{name}.py", siblings=True)


vs = _load("vs_pytorch")
mfu = _load("mfu")
kernel_list = _load("kernel_list")
GPT2 = GPTConfig(50304, 1024, 12, 12, 768)


# ---- MFU -----------------------------------------------------------------------------------------
def test_gpt2_parameter_count_is_nanogpts() -> None:
    """nanoGPT prints 123.69M for GPT-2 124M at vocabulary 50,304 with biases: all parameters
    (wte counted once, it is tied) less the 1024 x 768 position table. By hand: wte 50304*768,
    per layer 2 LayerNorms 4*768, QKV 768*2304 + 2304, proj 768*768 + 768, MLP 768*3072 +
    3072 + 3072*768 + 768; ln_f 2*768."""
    layer = 4 * 768 + (768 * 2304 + 2304) + (768 * 768 + 768) + (768 * 3072 + 3072) + (
        3072 * 768 + 768)
    assert mfu.nanogpt_params(GPT2) == 50304 * 768 + 12 * layer + 2 * 768 == 123_689_472


def test_parameter_count_matches_the_models_own() -> None:
    """The formula against the tensors rustyflow initialises, and PyTorch's module."""
    cfg = GPTConfig(101, 24, 2, 4, 32)
    weights = init_weights(cfg, 0)
    assert mfu.nanogpt_params(cfg) == sum(w.size for w in weights.values()) - weights["wpe"].size
    pytest.importorskip("torch")
    torch_gpt = _load("torch_gpt")
    model = torch_gpt.TorchGPT(101, 24, 2, 4, 32)
    assert mfu.nanogpt_params(cfg) == (sum(p.numel() for p in model.parameters())
                                       - model.wpe.weight.numel())


def test_mfu_is_nanogpts_estimate_by_hand() -> None:
    """6N + 12*L*H*Q*T FLOPs a token, T*B tokens a step, over the step time and the peak."""
    peak = mfu.peak_for(H100, "bf16")
    assert peak is not None and peak.tflops == 989.4 and peak.compute == "bf16"
    per_token = 6 * 123_689_472 + 12 * 12 * 12 * 64 * 1024
    assert mfu.flops_per_token(GPT2) == per_token == 855_383_040
    assert mfu.flops_per_step(GPT2, 16) == per_token * 1024 * 16
    step_s = 0.0430
    expected = per_token * 1024 * 16 / step_s / 989.4e12
    assert mfu.mfu(GPT2, 16, step_s, peak) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="positive"):
        mfu.mfu(GPT2, 16, 0.0, peak)


@pytest.mark.parametrize(("name", "precision", "tflops"), [
    (H100, "bf16", 989.4), (H100, "fp16", 989.4), (H100, "tf32", 494.7), (H100, "fp32", 67.0),
    ("NVIDIA H100 PCIe", "bf16", 756.0), ("NVIDIA H200", "bf16", 989.4),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA H100 NVL", "bf16", None), ("NVIDIA GeForce RTX 4090", "bf16", None),
])
def test_peak_is_the_tables_or_none(name: str, precision: str, tflops: float | None) -> None:
    peak = mfu.peak_for(name, precision)
    assert (peak.tflops if peak else None) == tflops
    if peak is not None:
        assert name in peak.source and "dense" in peak.source


def test_mfu_note_says_the_formula_and_the_peak_or_why_none() -> None:
    note = mfu.describe({"bf16": mfu.peak_for(H100, "bf16")}, H100)
    assert "6N + 12·L·H·Q·T" in note and "989.4 TFLOP/s dense bf16" in note
    none = mfu.describe({"bf16": None}, "NVIDIA GeForce RTX 4090")
    assert "no MFU" in none and "RTX 4090" in none and "TFLOP/s" not in none


# ---- options and plan ---------------------------------------------------------------------------
def test_gpt2_shapes_are_gpt2_124m_at_the_padded_vocabulary() -> None:
    for shape, batch in (("gpt2-b16", 16), ("gpt2-b32", 32)):
        cfg, b = vs.gpt_config(shape)
        assert (cfg.vocab_size, cfg.seq_len, cfg.n_layer, cfg.n_head, cfg.n_embd, b) == (
            50304, 1024, 12, 12, 768, batch)
        assert "V50304" in vs.describe_shape(shape)
    assert vs.gpt_config("medium")[0].vocab_size == vs.VOCAB


def test_gpu_plan_at_gpt2_compiles_in_default_mode_unless_told() -> None:
    args = vs.parse_args(["--device", "gpu", "--shapes", "medium,gpt2-b16", "--precisions",
                          "bf16"])
    compiled = {(j.shape, j.compile_mode) for j in vs.plan(args) if j.mode == "compile"}
    assert compiled == {("medium", "reduce-overhead"), ("gpt2-b16", "default")}
    graph = [j for j in vs.plan(args) if j.mode == "graph"]
    assert [j.shape for j in graph] == ["medium", "gpt2-b16"]
    args = vs.parse_args(["--device", "gpu", "--shapes", "gpt2-b32", "--precisions", "bf16",
                          "--compile-modes", "default,max-autotune"])
    jobs = [j for j in vs.plan(args) if j.mode == "compile"]
    assert [j.label() for j in jobs] == ["pytorch compile (default)",
                                         "pytorch compile (max-autotune)"]
    assert {(j.warmup, j.steps) for j in jobs} == {vs.DEFAULT_STEPS["gpu"]["gpt2-b32"]}


def test_fp8_rows_are_held_to_pytorch_bf16_and_to_rustyflow_bf16() -> None:
    """PyTorch trains no GEMM in FP8 by itself: fp8 has RustyFlow rows only, its ratios are
    against PyTorch's bf16 rows, its MFU against the bf16 peak, and a line gives its speed-up
    over RustyFlow's bf16 row of the same shape and mode."""
    args = vs.parse_args(["--device", "gpu", "--shapes", "gpt2-b16", "--precisions",
                          "bf16,fp8", "--skip-eager"])
    jobs = vs.plan(args)
    assert [(j.precision, j.label()) for j in jobs] == [
        ("bf16", "rustyflow graph"), ("bf16", "pytorch eager"),
        ("bf16", "pytorch compile (default)"), ("fp8", "rustyflow graph")]
    times = {"bf16": [0.032] * 3, "fp8": [0.025] * 3}
    rows = [(j, {"status": "ok", "times": times[j.precision] if j.framework == "rustyflow"
                 else [0.040] * 3, "memory": "-", "loss": 1.0}) for j in jobs]
    refs = [vs.reference(rows, "eager"), vs.reference(rows, "compile")]
    peak = mfu.peak_for("NVIDIA H100 80GB HBM3", "fp8")
    assert peak is not None and (peak.compute, peak.tflops) == ("bf16", 989.4)
    fp8_row = vs.table_row(jobs[-1], rows[-1][1], refs, peak, True)
    assert "| 0.62 | 0.62 |" in fp8_row  # 25 ms against PyTorch bf16's 40
    assert vs.fp8_lines(rows)[1].endswith("rustyflow graph: fp8 1.280x bf16's tokens/s.")


def test_fp8_delayed_rows_are_fp8_with_delayed_scaling() -> None:
    """fp8-delayed is PRECISION=fp8 with FP8_SCALING=delayed: RustyFlow rows only, held to
    bf16's like fp8's, with its own speed-up line."""
    assert vs.policy_of("fp8-delayed", threads=2) == RunPolicy(
        Precision.of("fp8"), threads=2, fp8_scaling="delayed")
    assert vs.policy_of("bf16").fp8_scaling == "current"
    args = vs.parse_args(["--device", "gpu", "--shapes", "gpt2-b16", "--precisions",
                          "bf16,fp8-delayed", "--skip-eager", "--skip-compile"])
    jobs = vs.plan(args)
    assert [(j.precision, j.framework) for j in jobs] == [
        ("bf16", "rustyflow"), ("bf16", "pytorch"), ("fp8-delayed", "rustyflow")]
    rows = [(j, {"status": "ok", "times": [0.032 if j.precision == "bf16" else 0.025] * 3,
                 "memory": "-", "loss": 1.0}) for j in jobs]
    assert vs.fp8_lines(rows)[1].endswith("fp8-delayed 1.280x bf16's tokens/s.")
    assert mfu.peak_for("NVIDIA H100 80GB HBM3", "fp8-delayed").compute == "bf16"


def test_attention_rows_and_skip_eager() -> None:
    """--attention repeats RustyFlow's rows per ATTENTION value, labelled; --skip-eager keeps
    its graph rows and PyTorch's."""
    args = vs.parse_args(["--device", "gpu", "--shapes", "small", "--precisions", "bf16",
                          "--skip-compile", "--skip-eager", "--attention", "own,cudnn"])
    assert [j.label() for j in vs.plan(args)] == [
        "rustyflow graph [own]", "rustyflow graph [cudnn]", "pytorch eager"]
    assert [j.attention for j in vs.plan(args)] == ["own", "cudnn", "auto"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--device", "gpu", "--attention", "flash"], "unknown value 'flash'"),
    (["--device", "gpu", "--precisions", "fp8"], "fp8's rows are held to bf16's"),
    (["--device", "gpu", "--precisions", "fp8-delayed"], "fp8-delayed's rows are held to"),
    (["--skip-eager"], "need --device gpu"),
    (["--shapes", "gpt2-b16"], "GPU-only"),
    (["--device", "gpu", "--compile-modes", "fastest"], "unknown mode 'fastest'"),
    (["--device", "gpu", "--skip-compile", "--compile-modes", "default"], "--skip-compile"),
    (["--kernel-list", "k.md"], "use --device gpu"),
    (["--device", "gpu", "--kernel-samples", "0"], "at least 1"),
])
def test_bad_options_are_one_line_errors(argv: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        vs.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_compile_mode_is_refused_by_the_step_too() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match="torch.compile mode"):
        vs.pytorch_step_fn(model, opt, "compile", compile_mode="fastest")


# ---- the report ---------------------------------------------------------------------------------
def _row(framework: str, mode: str, ms: float, peak: int, compile_mode: str = "") -> Any:
    job = vs.Job("gpu", "gpt2-b16", "bf16", framework, mode, 5, 30, 5, 0, compile_mode)
    return job, {"status": "ok", "times": [ms / 1e3] * 5, "loss": 10.8,
                 "memory": f"{peak / vs.GiB:.2f} GiB", "peak_bytes": peak}


def _render(monkeypatch: pytest.MonkeyPatch, rows: list[Any], gpu_name: str | None) -> str:
    monkeypatch.setattr(vs, "machine", lambda device: "test machine")
    monkeypatch.setattr(vs, "versions", lambda device: "test versions")
    args = vs.parse_args(["--device", "gpu", "--shapes", "gpt2-b16", "--precisions", "bf16",
                          "--curve-steps", "0"])
    return vs.render(args, rows, [], "", gpu_name)


def test_report_rows_carry_mfu_and_both_ratios(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_row("rustyflow", "graph", 43.0, 9 * vs.GiB),
            _row("pytorch", "eager", 60.0, 12 * vs.GiB),
            _row("pytorch", "compile", 36.9, 10 * vs.GiB, "default"),
            _row("pytorch", "compile", 40.0, 11 * vs.GiB, "max-autotune")]
    text = _render(monkeypatch, rows, H100)
    assert "| MFU |" in text and "989.4 TFLOP/s dense bf16" in text
    peak = mfu.peak_for(H100, "bf16")
    ours = next(line for line in text.splitlines() if "rustyflow graph" in line)
    cells = [c.strip() for c in ours.split("|")[1:-1]]
    assert cells[3].startswith("43.0") and cells[4] == f"{16 * 1024 / 0.043:,.0f}"
    assert cells[5] == f"{mfu.mfu(GPT2, 16, 0.043, peak):.1%}"
    # the compile ratio is against the fastest compile row (default, 36.9 ms)
    assert cells[6] == f"{43.0 / 60.0:.2f}" and cells[7] == f"{43.0 / 36.9:.2f}"
    assert f"{9 / 12:.2f}x PyTorch eager" in cells[8] and f"{9 / 10:.2f}x compile" in cells[8]
    assert "pytorch compile (max-autotune)" in text and "modes `default`, `max-autotune`" in text


def test_report_has_no_mfu_for_an_unknown_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_row("rustyflow", "graph", 43.0, 9 * vs.GiB), _row("pytorch", "eager", 60.0, 1)]
    text = _render(monkeypatch, rows, "NVIDIA GeForce RTX 4090")
    assert "| MFU |" not in text and "no MFU" in text and "%" not in text.split("| shape")[1]
    failed = (rows[0][0], {"status": "failed: RuntimeError: boom"})
    text = _render(monkeypatch, [failed, rows[1]], H100)
    line = next(x for x in text.splitlines() if "rustyflow graph" in x)
    assert line.endswith("failed: RuntimeError: boom |") and line.count("—") == 4


# ---- the kernel list ----------------------------------------------------------------------------
def test_kernel_list_sums_each_kernel_over_its_ops() -> None:
    """Two replays; `gemm` is launched by two ops (three records a replay), `add` by one."""
    fwd, bwd, add = ("mlp.matmul", "forward", "matmul"), ("mlp.matmul", "backward", "matmul"), (
        "residual", "forward", "elementwise")
    graph = KernelAttribution({1: fwd, 2: bwd, 3: bwd, 4: add})
    for base in (0, 10_000):
        graph.add_replay([KernelRecord("void gemm<1>(P)", base, base + 3000, 1),
                          KernelRecord("void gemm<1>(P)", base + 3000, base + 5000, 2),
                          KernelRecord("void gemm<1>(P)", base + 5000, base + 6000, 3),
                          KernelRecord("add_kernel", base + 7000, base + 8000, 4)])
    rows = kernel_list.by_kernel(graph)
    assert [(r["name"], r["ms"], r["calls"]) for r in rows] == [
        ("void gemm<1>(P)", pytest.approx(6e-3), 3.0), ("add_kernel", pytest.approx(1e-3), 1.0)]
    assert rows[0]["ops"] == {"mlp.matmul [forward]", "mlp.matmul [backward]"}
    text = "\n".join(kernel_list.render("gpt2-b16", graph))
    # span 8 us a replay, busy 7 us; gemm is 6 of the 8
    assert "0.008 ms (kernels busy 0.007 ms, idle between kernels 0.001 ms)" in text
    assert "4 kernels a step, 2 distinct" in text
    assert "| `gemm<1>` | 0.006 | 75.0% | 3 | mlp.matmul [backward], mlp.matmul [forward] |" in text
    assert "| matmul | 0.006 | 75.0% |" in text and "| elementwise | 0.001 | 12.5% |" in text


def test_kernel_lister_needs_a_sample() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        kernel_list.KernelLister(0)


class FakeTracer:
    """CuptiTracer's interface without CUDA: tags two nodes at capture, and each recorded
    run yields one replay's records of them (`refuse`: CUPTI taken by another tool)."""

    refuse = False
    read_s = 0.0

    def __init__(self) -> None:
        self.node_ops: dict[int, Any] = {}
        self.recorded = 0

    @contextlib.contextmanager
    def tag_nodes(self, current: Any) -> Iterator[None]:
        if self.refuse:
            raise CuptiUnavailable("CUPTI is in use by another tool")
        yield
        self.node_ops = {1: ("mlp.matmul", "forward", "matmul"), 2: ("add", "forward", "other")}

    def records(self, run: Any, synchronize: Any) -> list[KernelRecord]:
        run()
        synchronize()
        self.recorded += 1
        return [KernelRecord("gemm", 0, 300, 1), KernelRecord("add", 300, 400, 2)]


class FakeCaptured:
    def __init__(self) -> None:
        self.backend = get_backend("cpu")
        self.captures = self.replays = 0

    def capture(self) -> None:
        self.captures += 1

    def replay(self) -> None:
        self.replays += 1


def test_kernel_lister_tags_at_capture_then_samples_behind_ordinary_replays(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_list, "CuptiTracer", FakeTracer)
    lister = kernel_list.KernelLister(3)
    sampler = lister.sampler(get_backend("cpu"))
    assert sampler is not None and lister.sampler(get_backend("cpu")).tracer is sampler.tracer
    captured = FakeCaptured()
    lister.capture(sampler, captured)
    assert captured.captures == 1 and sampler.profiler.graph is not None
    graph = lister.sample(sampler, captured.replay, lambda: None)
    assert graph.replays == 3 and captured.replays == 3 * (kernel_list.AHEAD + 1)
    assert [(k["name"], k["calls"]) for k in kernel_list.by_kernel(graph)] == [
        ("gemm", 1.0), ("add", 1.0)]


def test_kernel_lister_without_cupti_captures_untagged_and_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeTracer, "refuse", True)
    monkeypatch.setattr(kernel_list, "CuptiTracer", FakeTracer)
    lister = kernel_list.KernelLister(2)
    sampler = kernel_list.GraphSampler(kernel_list.Profiler(get_backend("cpu")), FakeTracer(),
                                       2, budget=None)
    captured = FakeCaptured()
    lister.capture(sampler, captured)  # CUPTI refused at capture: captured all the same
    assert captured.captures == 1 and sampler.profiler.graph is None
    assert "in use by another tool" in (lister.unavailable or "")

    def gone() -> None:
        raise CuptiUnavailable("cupti-python is not usable (ImportError: no cupti)")

    monkeypatch.setattr(kernel_list, "CuptiTracer", gone)
    none = kernel_list.KernelLister(2)
    assert none.sampler(get_backend("cpu")) is None and "cupti-python" in none.unavailable


# ---- a tiny shape end to end --------------------------------------------------------------------
@pytest.fixture
def tiny_shape(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(vs.SHAPES, "tiny", TINY)
    monkeypatch.setitem(vs.SHAPE_VOCAB, "tiny", 64)
    for steps in vs.DEFAULT_STEPS.values():
        monkeypatch.setitem(steps, "tiny", (1, 2))
    return "tiny"


@pytest.mark.parametrize("device", DEVICES)
def test_tiny_rows_measure_and_report(device: str, tiny_shape: str) -> None:
    """Both frameworks' eager rows at the tiny shape, in this process: finite losses, the
    step times, the report's rows (the CPU has no MFU column: no published peak)."""
    if device == "cpu":
        pytest.importorskip("torch")
    rows = []
    for framework in ("rustyflow", "pytorch"):
        job = vs.Job(device, tiny_shape, "fp32", framework, "eager", 1, 2, 2, 0)
        result = vs.measure(job)
        assert result["status"] == "ok", result["status"]
        assert np.isfinite(result["loss"]) and len(result["times"]) == 2
        rows.append((job, result))
    args = argparse.Namespace(device=device, threads=0, precisions=["fp32"],
                              curve_precisions=[])
    text = vs.render(args, rows, [], "", None)
    assert "tiny (L1 H2 E16 T8 B2 V64)" in text and "| MFU |" not in text
    assert text.count("| tiny") == 2


@pytest.mark.gpu
@pytest.mark.parametrize("device", DEVICES[1:])
def test_gpu_graph_row_with_kernel_list(device: str, tiny_shape: str, tmp_path: Path) -> None:
    """The whole GPU path at the tiny shape: graph and eager rows of both frameworks, the
    compiled peer in nanoGPT's mode, MFU for a known GPU, and the kernel list (or why not)."""
    pytest.importorskip("torch")
    out, kernels = tmp_path / "peer.md", tmp_path / "kernels.md"
    code = vs.main(["--device", "gpu", "--shapes", tiny_shape, "--precisions", "bf16",
                    "--compile-modes", "default", "--curve-steps", "0", "--steps", "4",
                    "--warmup", "2", "--windows", "2", "--kernel-list", str(kernels),
                    "--kernel-samples", "2", "--out", str(out)])
    assert code == 0
    text = out.read_text()
    for label in ("rustyflow eager", "rustyflow graph", "pytorch eager",
                  "pytorch compile (default)"):
        line = next(x for x in text.splitlines() if f"| {label} |" in x)
        assert "failed" not in line and "not available" not in line, line
    listing = kernels.read_text()
    assert "## tiny (L1 H2 E16 T8 B2 V64), bf16, rustyflow graph" in listing
    assert "kernels a step" in listing or "No kernel list: cupti" in listing
