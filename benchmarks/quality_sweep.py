"""A recipe search, run and tabulated: named variants of a recipe, each over one or more seeds,
one training run each, and the table the quality results need (validation chooses, test is
read once per run).

    python benchmarks/quality_sweep.py --config configs/wikitext2-quality.env \
        --variant base= --variant locked=--locked-dropout \
        --variant "ema-late=--ema-decay 0.9995 --ema-start 4000" \
        --seeds 1,2,3 --device gpu --out benchmarks/results/quality-sweep-h100.md

Each run is `python -m rustyflow_py train --config CONFIG <variant flags> --seed S` with its
own log, console (.out) and checkpoint under --work; its numbers come from the run record in
that log (the `[RUN_JSON]` the trainer appends), never from its console. A run that fails or
is cut short by --timeout is a row that says so, not a missing row, and --out is rewritten
after each run. `--parallel N` runs N at once (on one GPU they share it: the wall times then
say so, not the speed of a run alone); `--devices gpu:0,gpu:1,...` runs one at a time on each
GPU, each run then alone on its GPU (a device named twice runs two at once on it).
"""

from __future__ import annotations

import argparse
import dataclasses
import queue
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rustyflow_py.reporting.log_parser import read_log  # noqa: E402
from rustyflow_py.reporting.text import markdown  # noqa: E402
from rustyflow_py.training.outputs.writing import write_atomically  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]
    seeds: tuple[int, ...] = ()  # its own seeds; none: the sweep's --seeds


@dataclasses.dataclass
class Result:
    variant: Variant
    seed: int
    status: str  # the record's status, or why there is no record
    val: float | None = None
    test: float | None = None
    train_s: float | None = None
    wall_s: float = 0.0


def parse_seeds(text: str) -> tuple[int, ...]:
    """Comma-separated seeds, each once (a seed twice would run into the same log)."""
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seeds {text!r}: expected comma-separated integers (e.g. 7,2026,42)") from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds {text!r}: a seed is named twice")
    return seeds


def parse_variant(text: str) -> Variant:
    """NAME=FLAGS or NAME@SEEDS=FLAGS (FLAGS split as a shell would; empty for the recipe as
    it is; SEEDS comma-separated, replacing --seeds for this variant)."""
    head, sep, flags = text.partition("=")
    name, at, seeds = head.partition("@")
    if not sep or not name.strip() or not name.replace("-", "").replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(
            f"--variant {text!r}: expected NAME=FLAGS or NAME@SEEDS=FLAGS with a name of "
            "letters, digits, - and _ (e.g. locked=--locked-dropout, base= for the recipe "
            "unchanged, or base@7,2026=)")
    return Variant(name.strip(), tuple(shlex.split(flags)), parse_seeds(seeds) if at else ())


def command(python: str, config: Path, device: str, variant: Variant, seed: int,
            work: Path, extra: Sequence[str]) -> list[str]:
    stem = f"{variant.name}-s{seed}"
    return [python, "-m", "rustyflow_py", "train", "--config", str(config), "--device", device,
            *variant.flags, *extra, "--seed", str(seed),
            "--model-path", str(work / f"{stem}.npz"), "--log-file", str(work / f"{stem}.log")]


def run_one(cmd: list[str], log: Path, variant: Variant, seed: int, timeout: float) -> Result:
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        code: int | str = proc.returncode
        console = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as cut:
        code = f"cut at the {timeout:.0f} s timeout"
        console = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x or ""
                          for x in (cut.stdout, cut.stderr))
    log.with_suffix(".out").write_text(console)  # why a run failed, beside its log
    result = Result(variant, seed, "", wall_s=time.perf_counter() - start)
    records = read_log(log) if log.is_file() else []
    if not records:
        result.status = f"no run record (exit {code})"
        return result
    r = records[-1]
    result.status = str(r.get("status"))
    result.val, result.test = r.get("best_val_ppl"), r.get("test_ppl")
    result.train_s = r.get("train_time_s")
    return result


def spread(values: Sequence[float]) -> str:
    """mean, and ± the sample standard deviation when there are several."""
    if not values:
        return "—"
    mean = statistics.fmean(values)
    return f"{mean:.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")


def table(results: Sequence[Result], variants: Sequence[Variant]) -> str:
    """One row per variant (means over its completed seeds), the best validation in bold,
    then one row per run."""
    done = {v.name: [r for r in results if r.variant == v and r.status == "completed"
                     and r.val is not None] for v in variants}
    means = {n: statistics.fmean(r.val for r in rs) for n, rs in done.items() if rs}
    best = min(means, key=means.__getitem__) if means else None
    rows = []
    for v in variants:
        rs, total = done[v.name], sum(r.variant == v for r in results)
        val = spread([r.val for r in rs])
        rows.append([v.name, f"`{shlex.join(v.flags) or '(recipe)'}`", f"{len(rs)} of {total}",
                     f"**{val}**" if v.name == best else val,
                     spread([r.test for r in rs if r.test is not None]),
                     spread([r.train_s / 60 for r in rs if r.train_s is not None])])
    runs = [[r.variant.name, str(r.seed), r.status,
             *("—" if x is None else f"{x:.2f}" for x in (r.val, r.test, r.train_s)),
             f"{r.wall_s:.0f}"] for r in results]
    lines = [*markdown(["variant", "flags", "seeds completed", "val ppl", "test ppl",
                        "train min"], rows, {2, 3, 4, 5}), "",
             *markdown(["run", "seed", "status", "best val ppl", "test ppl", "train s",
                        "wall s"], runs, {1, 3, 4, 5, 6})]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="the recipe (.env)")
    p.add_argument("--variant", type=parse_variant, action="append", required=True,
                   help="NAME=FLAGS or NAME@SEEDS=FLAGS, repeatable (base= runs the recipe "
                        "unchanged); runs start in the order given")
    p.add_argument("--seeds", default="1337",
                   help="comma-separated seeds of each variant that names none")
    p.add_argument("--device", default="gpu")
    p.add_argument("--devices", default="",
                   help="comma-separated devices (gpu:0,gpu:1,...), each running one run at a "
                        "time, so that each has its GPU to itself; replaces --device and "
                        "--parallel")
    p.add_argument("--parallel", type=int, default=1, help="runs at once")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take")
    p.add_argument("--work", type=Path, default=Path("sweep-runs"),
                   help="logs and checkpoints of the runs go here")
    p.add_argument("--extra", default="", help="flags added to every run (e.g. --max-steps 5)")
    p.add_argument("--out", type=Path,
                   help="also write the markdown here (again after each run)")
    args = p.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except argparse.ArgumentTypeError as e:
        p.error(f"--seeds: {e}")
    names = [v.name for v in args.variant]
    if len(set(names)) != len(names):
        p.error(f"--variant names repeat: {', '.join(names)}")
    if args.parallel < 1:
        p.error("--parallel must be at least 1")
    devices: queue.SimpleQueue[str] = queue.SimpleQueue()
    pool_of = [d for d in args.devices.split(",") if d] or [args.device] * args.parallel
    for device in pool_of:
        devices.put(device)
    args.work.mkdir(parents=True, exist_ok=True)
    jobs = [(v, s) for v in args.variant for s in v.seeds or seeds]  # in order given
    extra = shlex.split(args.extra)

    where = (f"one at a time on each of {', '.join(pool_of)}" if args.devices
             else f"{args.parallel} at a time, device {args.device}")
    head = (f"# Recipe sweep: {args.config}\n\n- Command: `python benchmarks/quality_sweep.py "
            f"{shlex.join(argv if argv is not None else sys.argv[1:])}`\n"
            f"- Runs: {len(jobs)} ({where}); "
            "validation chooses (bold: the best mean), test is each run's once.\n\n")
    # every run's row from the start, so that the table written after each run (a sweep
    # stopped from outside leaves the runs it finished) never misses one
    results = [Result(v, s, "not finished") for v, s in jobs]
    written = threading.Lock()

    def write() -> str:
        text = head + table(results, args.variant)
        if args.out:
            write_atomically(args.out, lambda f: f.write(text.encode()))
        return text

    def go(i: int) -> None:
        v, s = jobs[i]
        device = devices.get()  # a device is one run's at a time
        try:
            cmd = command(sys.executable, args.config, device, v, s, args.work, extra)
            result = run_one(cmd, args.work / f"{v.name}-s{s}.log", v, s, args.timeout)
        finally:
            devices.put(device)
        with written:
            results[i] = result
            write()

    with ThreadPoolExecutor(len(pool_of)) as pool:
        list(pool.map(go, range(len(jobs))))
    print(write())
    return 0 if all(r.status == "completed" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
