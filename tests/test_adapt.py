"""Evaluation-time adaptation (training/evaluation/adaptive/): the neural cache pointer and dynamic
evaluation against plain NumPy references on a tiny text in float64, the order that keeps
them honest (nothing is scored after the model has learnt from it), and `eval --adapt`."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from helpers import invoke

from rustyflow_py.engine.tensor import Tensor, no_grad
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.training.evaluation.adaptive.cache import CacheSettings, cache_perplexity
from rustyflow_py.training.evaluation.adaptive.dynamic import DynamicSettings, dynamic_perplexity
from rustyflow_py.training.evaluation.evaluate import perplexity, upload_split

V, T = 23, 8


def tiny_model(device: str = "cpu", dtype: object = np.float64) -> GPT:
    """A random GPT (float64 unless told), its embeddings scaled up so that its predictions
    are peaked; the same weights on every device."""
    model = GPT(GPTConfig(V, T, 2, 2, 16), device, seed=3, dtype=dtype)
    model.p["wte"].data[...] *= 20.0
    model.training = False
    return model


def tiny_text(n: int = 97) -> np.ndarray:
    """A text with repeats (so the cache finds its targets) and noise (so it misses some)."""
    rng = np.random.default_rng(0)
    motif = rng.integers(0, V, 7)
    return np.where(rng.random(n) < 0.3, rng.integers(0, V, n), np.resize(motif, n))


def window_starts(n: int, stride: int) -> list[tuple[int, int]]:
    """(start, first scored position) of the windows over a row of n tokens, written out:
    the first window scores all T positions, each later one advances `stride` tokens (0: T)
    and scores its last `stride`."""
    step = stride or T
    out, start = [(0, 0)], step
    while start + T + 1 <= n:
        out.append((start, T - step))
        start += step
    return out


def hidden_and_logits(model: GPT, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The final hidden states (T, E) and logits (T, V) of one window, from the model."""
    with no_grad():
        h = model(Tensor(x[None], device="cpu"), hidden=True).data[0]
    return h, h @ model.p["wte"].data.T


def reference_cache_nll(model: GPT, rows: np.ndarray, stride: int, window: int, theta: float,
                        lam: float) -> float:
    """The cache pointer position by position: each stream's list of (h_i, next token),
    p = (1 - lam) p_model + lam * (softmax weight of the last `window` entries whose next
    token is the target); an empty cache leaves p_model."""
    nlls = []
    for row in rows:
        memory: list[tuple[np.ndarray, int]] = []
        for start, first in window_starts(len(row), stride):
            h, logits = hidden_and_logits(model, row[start : start + T])
            for j in range(first, T):
                target = int(row[start + j + 1])
                p_model = np.exp(logits[j] - logits[j].max())
                p = p_model[target] / p_model.sum()
                if memory:
                    recent = memory[-window:]
                    s = np.array([theta * float(h[j] @ key) for key, _ in recent])
                    w = np.exp(s - s.max())
                    hit = sum(wi for wi, (_, nxt) in zip(w, recent, strict=True)
                              if nxt == target)
                    p = (1 - lam) * p + lam * hit / w.sum()
                nlls.append(-math.log(p))
                memory.append((h[j], target))
    return float(np.mean(nlls))


@pytest.mark.parametrize(("streams", "stride", "window", "theta", "lam"),
                         [(1, 0, 2000, 0.3, 0.1), (2, 3, 5, 0.05, 0.4), (1, 5, 1, 1.0, 0.9)])
def test_the_cache_equals_the_reference(streams: int, stride: int, window: int, theta: float,
                                        lam: float) -> None:
    model = tiny_model()
    stream = upload_split(model.buffer.backend, tiny_text(), streams)
    got = cache_perplexity(model, stream, T, stride, CacheSettings(window, theta, lam))
    expected = reference_cache_nll(model, stream, stride, window, theta, lam)
    assert got["nll"] == pytest.approx(expected, rel=1e-12)
    assert got["tokens"] == streams * (T + (len(window_starts(stream.shape[1], stride)) - 1)
                                       * (stride or T))


def test_a_cache_of_weight_0_is_the_model_alone() -> None:
    model = tiny_model()
    stream = upload_split(model.buffer.backend, tiny_text(), 3)
    got = cache_perplexity(model, stream, T, 2, CacheSettings(lam=0.0))
    assert got["nll"] == pytest.approx(perplexity(model, stream, T, 2)["nll"], rel=1e-12)


def test_a_position_is_not_in_its_own_cache() -> None:
    """With lambda 1 the cache alone predicts: a text of distinct tokens never repeats a
    next token, so every position after the first has p = 0, unless a position could see
    its own (hidden state, target) pair, which would give it the highest weight."""
    model = tiny_model()
    stream = upload_split(model.buffer.backend, np.arange(V), 1)
    assert cache_perplexity(model, stream, T, 0, CacheSettings(lam=1.0))["perplexity"] == math.inf


def sgd_step(model: GPT, original: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
             first: int, lr: float, decay: float) -> float:
    """Score one window with the current weights, then one SGD-with-decay step on its loss,
    tensor by tensor: the window's mean NLL as scored."""
    model.buffer.zero_grad()
    loss = model(Tensor(x, device="cpu"), Tensor(y, device="cpu"), score_from=first)
    score = float(loss.data)
    loss.backward()
    for name, p in model.p.items():
        p.data[...] = p.data - lr * p.grad + decay * (original[name] - p.data)
    return score


def reference_dynamic_nll(rows: np.ndarray, segment: int, lr: float, decay: float) -> float:
    """Dynamic evaluation window after window on a fresh model: scored first, then a step."""
    model = tiny_model()
    original = {name: p.data.copy() for name, p in model.p.items()}
    total = count = 0.0
    for start, first in window_starts(rows.shape[1], segment):
        x, y = rows[:, start : start + T], rows[:, start + 1 : start + T + 1]
        total += sgd_step(model, original, x, y, first, lr, decay) * (T - first)
        count += T - first
    return total / count


@pytest.mark.parametrize(("streams", "segment", "lr", "decay"),
                         [(1, 0, 0.5, 0.0), (2, 3, 0.2, 0.1), (1, 1, 0.05, 0.5)])
def test_dynamic_evaluation_equals_the_reference(streams: int, segment: int, lr: float,
                                                 decay: float) -> None:
    model = tiny_model()
    before = model.buffer.flat.copy()
    stream = upload_split(model.buffer.backend, tiny_text(), streams)
    got = dynamic_perplexity(model, stream, T, DynamicSettings(lr, decay, segment))
    assert got["nll"] == pytest.approx(reference_dynamic_nll(stream, segment, lr, decay),
                                       rel=1e-12)
    assert np.array_equal(model.buffer.flat, before)  # the weights are restored


def test_no_segment_is_scored_after_the_model_learnt_from_it() -> None:
    """The first segment scores as the unadapted model does; the second as the model after
    one step on the first alone. Stepping before scoring fails both."""
    model = tiny_model()
    stream = upload_split(model.buffer.backend, tiny_text(), 1)
    settings = DynamicSettings(lr=0.5)
    one = dynamic_perplexity(model, stream, T, settings, budget=T)["nll"]
    two = dynamic_perplexity(model, stream, T, settings, budget=2 * T)["nll"]
    x, y = stream[:, :2 * T], stream[:, 1 : 2 * T + 1]
    fresh = tiny_model()
    original = {name: p.data.copy() for name, p in fresh.p.items()}
    unadapted = sgd_step(fresh, original, x[:, :T], y[:, :T], 0, 0.5, 0.0)
    after_one = sgd_step(fresh, original, x[:, T:], y[:, T:], 0, 0.5, 0.0)
    assert one == pytest.approx(unadapted, rel=1e-12)
    assert 2 * two - one == pytest.approx(after_one, rel=1e-9)
    assert abs(after_one - float(model(Tensor(x[:, T:], device="cpu"),
                                       Tensor(y[:, T:], device="cpu")).data)) > 1e-3


def test_dynamic_evaluation_with_lr_0_is_the_model_alone() -> None:
    model = tiny_model()
    stream = upload_split(model.buffer.backend, tiny_text(), 2)
    got = dynamic_perplexity(model, stream, T, DynamicSettings(lr=0.0, segment=3))
    assert got["nll"] == pytest.approx(perplexity(model, stream, T, 3)["nll"], rel=1e-12)


@pytest.mark.parametrize("settings", [CacheSettings(7, 0.2, 0.3),
                                      DynamicSettings(0.2, 0.1, 3)], ids=["cache", "dynamic"])
def test_float32_on_each_device_agrees_with_float64(device: str, settings: object) -> None:
    """The same code on the device's array module (CuPy on the GPU), in float32."""
    exact = tiny_model()
    model = tiny_model(device, np.float32)
    tokens = tiny_text()
    expected = settings.evaluate(exact, upload_split(exact.buffer.backend, tokens, 2), T,
                                 settings.stride(T, 0))["nll"]
    got = settings.evaluate(model, upload_split(model.buffer.backend, tokens, 2), T,
                            settings.stride(T, 0))["nll"]
    assert got == pytest.approx(expected, rel=1e-4)


# `eval --adapt` on a checkpoint of the tiny corpus (TINY: SEQ_LEN 16, BATCH_SIZE 4)
EVAL = ("eval", "--model", "models/tiny-cpu.npz", "--device", "cpu")
NUMBER = r"(\d+\.\d{3})"


def plain_perplexity(output: str) -> str:
    return re.search(r"^valid perplexity " + NUMBER, output, re.M).group(1)


def test_eval_adapt_cache_says_so_beside_the_model_alone(workspace: object) -> None:
    plain = invoke(*EVAL)
    adapted = invoke(*EVAL, "--adapt", "cache", "--streams", "4")
    assert adapted.exit_code == 0, adapted.output
    line = re.search(r"^valid perplexity .*$", adapted.output, re.M).group(0)
    found = re.fullmatch(rf"valid perplexity {NUMBER} with adaptive evaluation \(neural "
                         rf"cache: window 2000, theta 0\.3, lambda 0\.1\); the model alone: "
                         rf"{NUMBER}", line)
    assert found, line
    assert found.group(2) == plain_perplexity(plain.output)  # the same windows and streams
    assert found.group(1) != found.group(2)
    assert re.search(r"^  mean NLL [\d.]+ adaptive, [\d.]+ the model alone, on [\d,]+ tokens "
                     r"\(4 streams, non-overlapping 16-token windows, cpu\)$", adapted.output,
                     re.M)


def test_eval_adapt_dynamic_says_so_beside_the_model_alone(workspace: object) -> None:
    result = invoke(*EVAL, "--adapt", "dynamic", "--dynamic-segment", "8", "--dynamic-lr",
                    "0.05", "--eval-tokens", "200")
    assert result.exit_code == 0, result.output
    assert re.search(rf"^valid perplexity {NUMBER} with adaptive evaluation \(dynamic "
                     rf"evaluation: SGD lr 0\.05, decay 0, segment 8\); the model alone: "
                     rf"{NUMBER}$", result.output, re.M), result.output
    assert re.search(r"on 200 of [\d,]+ tokens \(1 stream, sliding 16-token windows, stride "
                     r"8, cpu\)$", result.output, re.M), result.output


@pytest.mark.parametrize(("args", "named"), [
    (("--adapt", "pointer"), "--adapt pointer is not a method: pass --adapt cache"),
    (("--adapt", "cache", "--cache-lambda", "1.5"), "--cache-lambda 1.5 is out of range: "
                                                    "pass a value from 0 to 1"),
    (("--adapt", "cache", "--cache-window", "0"), "--cache-window 0 is out of range"),
    (("--adapt", "cache", "--cache-theta", "nan"), "--cache-theta nan is out of range"),
    (("--adapt", "dynamic", "--dynamic-lr", "-1"), "--dynamic-lr -1 is out of range: pass a "
                                                   "value at least 0"),
    (("--adapt", "dynamic", "--dynamic-decay", "2"), "--dynamic-decay 2 is out of range"),
    (("--adapt", "dynamic", "--cache-window", "9"), "--cache-window is an option of --adapt "
                                                    "cache: pass --adapt cache, or leave"),
    (("--dynamic-lr", "0.1",), "--dynamic-lr is an option of --adapt dynamic"),
    (("--streams", "2"), "--streams is an option of --adapt: pass --adapt cache or"),
    (("--adapt", "cache", "--streams", "0"), "--streams 0 is out of range"),
])
def test_eval_adapt_errors_are_one_line_naming_the_option(args: tuple[str, ...],
                                                          named: str) -> None:
    """Refused before the checkpoint is read (there is none here)."""
    assert_one_error(invoke(*EVAL, *args), named)


def test_a_segment_longer_than_the_model_s_windows_is_refused(workspace: object) -> None:
    assert_one_error(invoke(*EVAL, "--adapt", "dynamic", "--dynamic-segment", "17"),
                     "--dynamic-segment 17 is longer than the model's SEQ_LEN=16: pass 1 to 16")


def test_eval_stride_sets_the_windows_of_plain_evaluation_and_of_the_cache(
        workspace: object) -> None:
    """The workspace model trained with non-overlapping 16-token windows; --eval-stride 4
    scores every token after at least 12 of context: the line names the windows, and the
    model alone beside the cache is that same evaluation."""
    plain = invoke(*EVAL, "--eval-stride", "4")
    assert plain.exit_code == 0, plain.output
    assert re.search(r", sliding 16-token windows, stride 4, cpu\)$", plain.output, re.M)
    assert plain_perplexity(plain.output) != plain_perplexity(invoke(*EVAL).output)
    cached = invoke(*EVAL, "--eval-stride", "4", "--adapt", "cache", "--streams", "4")
    assert cached.exit_code == 0, cached.output
    alone = re.search(rf"the model alone: {NUMBER}$", cached.output, re.M).group(1)
    assert alone == plain_perplexity(plain.output)
    assert "sliding 16-token windows, stride 4, cpu)" in cached.output


@pytest.mark.parametrize(("args", "named"), [
    (("--eval-stride", "17"), "--eval-stride 17 is longer than the model's SEQ_LEN=16: pass "
                              "1 to 16 (0: non-overlapping windows)"),
    (("--eval-stride", "4", "--adapt", "dynamic"), "--eval-stride is not an option of --adapt "
                                                   "dynamic"),
])
def test_a_stride_the_windows_cannot_take_is_refused(workspace: object, args: tuple[str, ...],
                                                     named: str) -> None:
    assert_one_error(invoke(*EVAL, *args), named)


def assert_one_error(result: object, named: str) -> None:
    assert result.exit_code == 1
    assert result.output.splitlines() == [result.output.strip()]
    assert result.output.startswith(f"Error: {named}"), result.output


def test_eval_help_shows_the_settings_defaults() -> None:
    text = " ".join(invoke("eval", "--help").output.split())
    cache, dynamic = CacheSettings(), DynamicSettings()
    for option, value in (("--cache-window", cache.window), ("--cache-theta", cache.theta),
                          ("--cache-lambda", cache.lam), ("--dynamic-lr", dynamic.lr),
                          ("--dynamic-decay", dynamic.decay),
                          ("--dynamic-segment", dynamic.segment)):
        shown = re.escape(f"{value:g}")
        assert re.search(rf"{option} \w+ [^[]*\[default: {shown}\b", text), option
