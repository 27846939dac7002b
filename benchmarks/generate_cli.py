"""`rustyflow generate` and `rustyflow chat` as a user runs them, one process per mode.

A random GPT-2 124M saved by transformers (`save_pretrained`), `rustyflow import hf`, then
`rustyflow generate --model ... --max-tokens N` in each sampling mode and a two-turn
`rustyflow chat`; prints each command and the lines it wrote to stderr (the start-up and the
decode rate), and a Markdown table of the rates.

    python benchmarks/generate_cli.py --device gpu --out benchmarks/results/x.md
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = {  # flags over the config's defaults (TEMPERATURE 0.8, TOP_K 0, TOP_P 0.9)
    "greedy": ["--temperature", "0"],
    "temperature": ["--top-p", "1"],
    "top-k 50": ["--top-k", "50", "--top-p", "1"],
    "top-p 0.9 (defaults)": [],
    "top-k 50 + top-p 0.95": ["--top-k", "50", "--top-p", "0.95"],
}
RATE = re.compile(r"Decoding: .*\(([\d,.]+) tokens/s")


def rustyflow(*args: str, stdin: str | None = None) -> str:
    """Run the CLI (this checkout's package); its stderr, echoed with the command."""
    command = [sys.executable, "-m", "rustyflow_py", *args]
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    print("$ rustyflow " + " ".join(args) + "\n" + done.stderr, flush=True)
    return done.stderr


def rate(stderr: str) -> str:
    found = RATE.search(stderr)
    return found.group(1) if found else "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", help="also write the table to this Markdown file")
    args = ap.parse_args()
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "gpt2-random"
        transformers.GPT2LMHeadModel(transformers.GPT2Config()).save_pretrained(
            hf, safe_serialization=True)
        model = str(Path(tmp) / "gpt2.npz")
        rustyflow("import", "hf", str(hf), "--out", model)
        prompt = " ".join(f"<token-{i}>" for i in range(1, 9))
        base = ["--model", model, "--device", args.device, "--max-tokens", str(args.tokens)]
        lines = ["| mode | generate tok/s | chat tok/s |", "|---|---:|---:|"]
        for mode, flags in MODES.items():
            generated = rustyflow("generate", *base, "--prompt", prompt, *flags)
            chat_base = [*base[:-1], str(args.tokens // 2)]
            chatted = rustyflow("chat", *chat_base, *flags, stdin=f"{prompt}\n<token-9>\n")
            lines.append(f"| {mode} | {rate(generated)} | {rate(chatted)} |")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
