"""Tuning `eval --adapt` on validation: a grid of each method's settings over one checkpoint,
in one table whose rows name their settings as the flags `eval --adapt` takes.

    python benchmarks/adaptive_sweep.py --model models/q-gpu-best.npz --device gpu \
        --eval-tokens 30000 --cache "window=2000 theta=0.01,0.03,0.1 lambda=0.1,0.2" \
        --dynamic "lr=0.003,0.01,0.03 segment=32,128" --out sweep.md

The checkpoint is opened and the split uploaded once; each row is the method's own
`evaluate` (the object `eval --adapt` calls) on the same streams, beside the model alone on
the same windows. The split is the validation one unless told: settings are chosen there, and
the test split is then read once through the command itself (scripts/device/adaptive_eval.sh
passes each method's best row on to `eval --adapt`).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rustyflow_py.reporting.text import markdown  # noqa: E402
from rustyflow_py.training.evaluation.adaptive.run import METHODS, Method, method_of  # noqa: E402
from rustyflow_py.training.evaluation.evaluate import (  # noqa: E402
    open_checkpoint,
    perplexity,
    upload_split,
)
from rustyflow_py.training.outputs.writing import write_atomically  # noqa: E402


def grid(method: str, text: str) -> list[dict[str, Any]]:
    """The options of every combination of "key=v1,v2 key=v3" (keys: the method's option
    names less their prefix, e.g. theta for --cache-theta)."""
    axes = []
    for item in text.split():
        key, _, values = item.partition("=")
        option = f"{method}_{key}"
        if option not in METHODS[method][1]:
            known = ", ".join(o.removeprefix(method + "_") for o in METHODS[method][1])
            raise SystemExit(f"--{method}: {key} is not one of its settings ({known})")
        try:
            axes.append([(option, float(v) if "." in v or "e" in v else int(v))
                         for v in values.split(",")])
        except ValueError:
            raise SystemExit(f"--{method}: {item!r} is not key=number,number,...") from None
    return [dict(combo) for combo in itertools.product(*axes)]


def flags(options: dict[str, Any]) -> str:
    return " ".join(f"--{o.replace('_', '-')} {v}" for o, v in options.items())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--split", default="valid", choices=["valid", "test"])
    parser.add_argument("--eval-tokens", type=int, default=0, help="0: the whole split")
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--cache", default="", help='a grid, e.g. "theta=0.1,0.3 lambda=0.1"')
    parser.add_argument("--dynamic", default="", help='a grid, e.g. "lr=0.01,0.03 segment=32"')
    parser.add_argument("--out", type=Path, help="the table (markdown)")
    args = parser.parse_args(argv)

    model, cfg, corpus, used = open_checkpoint(args.model, args.device)
    stream = upload_split(model.buffer.backend, getattr(corpus, args.split), args.streams)
    header = (f"`{args.model}` on {args.split} ({args.eval_tokens or 'all'} tokens, "
              f"{args.streams} stream(s), {used})")
    alone: dict[int, float] = {}
    rows = []
    for name, text in (("cache", args.cache), ("dynamic", args.dynamic)):
        for options in grid(name, text) if text else []:
            settings: Method = method_of(name, args.streams, options)
            settings.check(cfg.seq_len)
            stride = settings.stride(cfg.seq_len, cfg.eval_stride)
            if stride not in alone:
                alone[stride] = perplexity(model, stream, cfg.seq_len, stride,
                                           args.eval_tokens)["perplexity"]
            began = time.perf_counter()
            got = settings.evaluate(model, stream, cfg.seq_len, stride, args.eval_tokens)
            seconds = time.perf_counter() - began
            rows.append([name, flags(options), f"{got['perplexity']:.3f}",
                         f"{alone[stride]:.3f}", f"{seconds:.1f}"])
            print(" | ".join(rows[-1]), flush=True)
            if args.out:  # row by row: a sweep cut short keeps the rows it finished
                write_table(args.out, header, rows)
    print(table(header, rows))


def table(header: str, rows: list[list[str]]) -> str:
    columns = ["method", "settings", "adaptive ppl", "model alone", "s"]
    return header + "\n\n" + "\n".join(markdown(columns, rows, {2, 3, 4})) + "\n"


def write_table(path: Path, header: str, rows: list[list[str]]) -> None:
    text = table(header, rows).encode()
    write_atomically(path, lambda f: f.write(text))


if __name__ == "__main__":
    main()
