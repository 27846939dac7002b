"""`rustyflow eval --adapt cache|dynamic`: a checkpoint's perplexity with evaluation-time
adaptation, and the model alone on the same windows of the same streams, side by side."""

from __future__ import annotations

import contextlib
from typing import Any

from ....errors import ConfigError
from ....reporting.text import on_tokens, plural
from ..evaluate import (
    Status,
    evaluation_stride,
    open_checkpoint,
    perplexity,
    scored_tokens,
    upload_split,
    with_per_word,
)
from .cache import CacheSettings
from .dynamic import DynamicSettings
from .ranges import check_range

Method = CacheSettings | DynamicSettings

# each method's settings class, and its options (parameter names) by the field they set
METHODS: dict[str, tuple[type[Method], dict[str, str]]] = {
    "cache": (CacheSettings, {"cache_window": "window", "cache_theta": "theta",
                              "cache_lambda": "lam"}),
    "dynamic": (DynamicSettings, {"dynamic_lr": "lr", "dynamic_decay": "decay",
                                  "dynamic_segment": "segment"}),
}


def method_of(adapt: str | None, streams: int | None, options: dict[str, Any],
              eval_stride: int | None = None) -> Method | None:
    """The settings `--adapt` and its options give (an option that is None: not given, its
    default), None without --adapt. A ConfigError naming the option and the fix for an
    unknown method, a value out of range, or an option that --adapt would not use (among
    them --eval-stride, which dynamic evaluation's windows do not take)."""
    if adapt is not None and adapt not in METHODS:
        raise ConfigError(f"--adapt {adapt} is not a method: pass --adapt cache (the neural "
                          f"cache pointer) or --adapt dynamic (dynamic evaluation)")
    if streams is not None:
        if adapt is None:
            raise ConfigError("--streams is an option of --adapt: pass --adapt cache or "
                              "--adapt dynamic, or leave --streams out")
        check_range("--streams", streams, 1)
    for name, (_, fields) in METHODS.items():
        for option in fields:
            if options.get(option) is not None and adapt != name:
                flag = "--" + option.replace("_", "-")
                raise ConfigError(f"{flag} is an option of --adapt {name}: pass --adapt "
                                  f"{name}, or leave {flag} out")
    if eval_stride is not None and adapt == "dynamic":
        raise ConfigError("--eval-stride is not an option of --adapt dynamic, whose windows "
                          "advance one segment: pass --dynamic-segment S instead")
    if adapt is None:
        return None
    settings, fields = METHODS[adapt]
    return settings(**{field: options[option] for option, field in fields.items()
                       if options.get(option) is not None})


def evaluate_adaptive(path: str, split: str, device: str, method: Method,
                      data_dir: str | None = None, streams: int = 1, budget: int = 0,
                      status: Status | None = None,
                      eval_stride: int | None = None) -> dict[str, Any]:
    """Both numbers for a checkpoint on `split`, read as `streams` parallel streams (1: the
    text in order, as the papers read it), on its first `budget` scored tokens (0 = all):
    "model" from evaluate.perplexity, "adaptive" from the method. `status`, `eval_stride`:
    see evaluate.evaluate_checkpoint; the method's `stride` decides its windows (dynamic
    evaluation's advance one segment, whatever `eval_stride` says: method_of refuses both)."""
    model, cfg, corpus, used = open_checkpoint(path, device, data_dir)
    method.check(cfg.seq_len)
    stream = upload_split(model.buffer.backend, getattr(corpus, split), streams)
    stride = method.stride(cfg.seq_len, evaluation_stride(cfg, eval_stride))
    tokens, _ = scored_tokens(stream.shape, cfg.seq_len, stride, budget)
    with _shown(status, f"{split} (the model alone)", tokens) as advance:
        alone = perplexity(model, stream, cfg.seq_len, stride, budget, advance)
    with _shown(status, f"{split} (adaptive: {method.name})", tokens) as advance:
        adapted = method.evaluate(model, stream, cfg.seq_len, stride, budget, advance)
    return {"adaptive": with_per_word(adapted, corpus, split),
            "model": with_per_word(alone, corpus, split), "method": method.words(cfg.seq_len),
            "split": split, "device": used, "streams": streams}


def _shown(status: Status | None, label: str, tokens: int) -> Any:
    """`status(label, tokens)`, or a context yielding no `advance` without one."""
    return status(label, tokens) if status else contextlib.nullcontext()


def result_lines(result: dict[str, Any]) -> list[str]:
    """What `eval --adapt` prints: the adaptive number, said to be one, beside the model's."""
    a, m, split = result["adaptive"], result["model"], result["split"]
    per = " per token" if "word_perplexity" in a else ""
    lines = [f"{split} perplexity {a['perplexity']:.3f}{per} with adaptive evaluation "
             f"({result['method']}); the model alone: {m['perplexity']:.3f}",
             f"  mean NLL {a['nll']:.4f} adaptive, {m['nll']:.4f} the model alone, on "
             f"{on_tokens(a['tokens'], a['of'])} ({plural(result['streams'], 'stream')}, "
             f"{a['protocol']}, {result['device']})"]
    if per:
        lines.append(f"{split} perplexity {a['word_perplexity']:.3f} per word of the text "
                     f"with adaptive evaluation; the model alone: {m['word_perplexity']:.3f}")
    return lines
