"""The `rustyflow` command line: a thin layer over importable functions."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import click

from . import __version__
from .cli_help import SectionedCommand
from .errors import RustyFlowError, command, install_command
from .training.config.config import KEYS, ConfigError, check_data_dir, load_config, tagged


def _hyperparameter_options(fn: Any) -> Any:
    """One --<key> option per config key (values are validated by load_config), in the
    order of the config's declaration; `--help` lists them by section (cli_help)."""
    for key in reversed(KEYS.values()):
        if key.type == "bool":
            name = key.flag[2:]
            fn = click.option(f"--{name}/--no-{name}", key.attr, default=None,
                              help=f"{key.help} [default: {str(key.default).lower()}]")(fn)
        else:
            shown = f" [default: {key.default}]" if key.default != "" else ""
            fn = click.option(key.flag, key.attr, default=None, metavar=key.type.upper(),
                              help=key.help + shown)(fn)
    return fn


def _load(config: str | None, overrides: dict[str, Any],
          allow_unknown_keys: bool = False) -> Any:
    """The validated config; its warnings on stderr, unless RUSTYFLOW_CONFIG_WARNED says the
    train scripts' banner has just printed them (warmup and train would repeat them)."""
    import os

    try:
        cfg, warnings = load_config(config, {k.upper(): v for k, v in overrides.items()},
                                    allow_unknown_keys=allow_unknown_keys)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if not os.environ.get("RUSTYFLOW_CONFIG_WARNED"):
        for w in warnings:
            click.echo(f"WARN: {w}", err=True)
    return cfg


def _out_of_memory(exc: Exception) -> str | None:
    """A GPU out-of-memory error as one line with the sizes and what to reduce, else None."""
    if type(exc).__name__ != "OutOfMemoryError":
        return None
    from .engine.devices import gpu_memory_line

    return (f"GPU out of memory: {exc}. {gpu_memory_line()}. Reduce BATCH_SIZE or SEQ_LEN "
            f"(activations grow with both), or EMBED_DIM/NUM_LAYERS (the model itself)")


def _path_error(exc: OSError) -> str:
    """A file-system error on a path as one line: the path (shortened), the reason, the fix."""
    name = str(exc.filename)
    shown = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]} ({len(name)} characters)"
    return f"{shown}: {exc.strerror or exc}: pass a path that can be used here"


class _Main(click.Group):
    """The command group: every expected error (a RustyFlowError, a GPU out-of-memory, a path
    the file system refuses) becomes one line and exit status 1; a stop signal exits 128 + its
    number; anything else is a bug and keeps its traceback. Usage lines name the program as
    the hints do (errors.command), whichever way it was started; `--help` lists options in
    sections (cli_help)."""

    command_class = SectionedCommand

    def main(self, *args: Any, prog_name: str | None = None, **kwargs: Any) -> Any:
        return super().main(*args, prog_name=prog_name or command(), **kwargs)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["argv"] = list(args)  # what `train --gpus N` starts each worker with
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return self._invoke(ctx)
        except click.exceptions.Exit:
            raise
        except Exception as exc:  # one rank of an MPI job failing before it joined the run
            from .distributed.group import end_job_if_rank

            end_job_if_rank(exc.format_message() if isinstance(exc, click.ClickException)
                            else f"{type(exc).__name__}: {exc}")
            raise

    def _invoke(self, ctx: click.Context) -> Any:
        from .training.run.signals import Stopped

        try:
            return super().invoke(ctx)
        except RustyFlowError as exc:
            raise click.ClickException(str(exc)) from None
        except Stopped as exc:
            sys.exit(exc.exit_code)
        except OSError as exc:
            if exc.filename is None:  # not about a path the user gave: a bug
                raise
            raise click.ClickException(_path_error(exc)) from None
        except Exception as exc:
            message = _out_of_memory(exc)
            if message is None:
                raise
            raise click.ClickException(message) from None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rustyflow")
def main() -> None:
    """RustyFlow: train a GPT on WikiText-2 with a from-scratch engine on NumPy or CuPy."""


def _load_run(config: str | None, positional: str | None, overrides: dict[str, Any],
              allow_unknown_keys: bool) -> Any:
    """The config of a training run (train, warmup, banner): the file given as `train CONFIG`
    (as nanoGPT's `train.py config/x.py`) or as `--config CONFIG` (both at once leave it
    unclear which one to read), and a DATA_DIR that exists."""
    if config is not None and positional is not None:
        raise click.ClickException(f"two config files: {positional} and --config {config}: "
                                   f"pass one")
    cfg = _load(config if positional is None else positional, overrides, allow_unknown_keys)
    try:
        check_data_dir(cfg)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    return cfg


def _resume_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--resume's checkpoint must exist. A path that lacks the -cpu/-gpu which train adds to
    a MODEL_PATH from the config gets the file that has it named."""
    if value is None or Path(value).is_file():
        return value
    near = [p for p in (tagged(value, d) for d in ("cpu", "gpu")) if Path(p).is_file()]
    where = "" if Path(value).is_absolute() else f" ({Path(value).absolute()})"
    hint = (f"; {' and '.join(near)} {'exists' if len(near) == 1 else 'exist'} (train adds "
            f"-cpu or -gpu to a MODEL_PATH from the config): pass --resume {near[0]}" if near
            else ": pass the checkpoint a run wrote (its `Checkpoint:` line)")
    raise click.ClickException(f"--resume {value}: no such file{where}{hint}")


def _train_options(fn: Any) -> Any:
    """The options of `train` (`warmup` and `banner` take the same, so a script can pass one
    list): the config file, as CONFIG or --config, anywhere among the options."""
    for option in reversed((
        click.argument("config_file", metavar="[CONFIG]", required=False,
                       type=click.Path(dir_okay=False)),
        click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
                     help="config file, as CONFIG (default: ./config.env when present)"),
        click.option("--allow-unknown-keys", is_flag=True,
                     help="a config file's unknown keys are warnings, not an error"),
        click.option("--resume", type=click.Path(dir_okay=False), default=None,
                     callback=_resume_file,
                     help="continue exactly from a checkpoint written by train, writing to "
                          "it (unless --model-path)"),
        click.option("--trace", "trace", type=click.Path(dir_okay=False), default=None,
                     metavar="FILE.json", help="write the profiled steps as a Chrome/Perfetto "
                     "trace (needs PROFILE)"),
        click.option("--processes", type=click.IntRange(min=1), default=None, metavar="N",
                     help="data-parallel processes on the CPU (DEVICE=cpu), started through "
                     "mpiexec like --gpus N, which takes GPUs"),
    )):
        fn = option(fn)
    return _hyperparameter_options(fn)


def _with_init_shape(init_from: str | None, resume: str | None,
                     overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` with --init-from's model shape (the checkpoint's) filled in."""
    if not init_from:
        return overrides
    if resume:
        raise click.UsageError("--init-from starts a new run from a checkpoint's weights, "
                               "--resume continues a run: pass one of them")
    from .training.start.init_from import shape_overrides

    return shape_overrides(init_from, overrides)


@main.command()
@_train_options
@click.option("--overwrite", is_flag=True,
              help="replace the checkpoint of another run at MODEL_PATH (a resumed run "
                   "replaces its own without this)")
@click.option("--init-from", "init_from", type=click.Path(dir_okay=False), default=None,
              metavar="CKPT", help="start from a checkpoint's weights (fine-tuning, e.g. one "
              "`import hf` wrote): its model shape, a new optimizer and schedule")
@click.option("--allow-data-change", is_flag=True,
              help="let --resume continue on training data other than the checkpoint's "
                   "(its fingerprint differs)")
def train(config_file: str | None, config: str | None, allow_unknown_keys: bool,
          resume: str | None, trace: str | None, overwrite: bool, init_from: str | None,
          allow_data_change: bool, **overrides: Any) -> None:
    """Train a GPT per CONFIG (or ./config.env) and the options; append the profiling
    report to the log."""
    from .distributed.launcher import launch, ranks_to_start
    from .distributed.world import World
    from .reporting.progress import TrainingProgress
    from .training.run.loop import train as run_training
    from .training.run.signals import Stopped

    processes = overrides.pop("processes")
    cfg = _load_run(config, config_file, _with_init_shape(init_from, resume, overrides),
                    allow_unknown_keys)
    ranks = ranks_to_start(cfg, processes, World.from_env())
    if ranks:
        argv = click.get_current_context().find_root().meta["argv"]
        sys.exit(launch([sys.executable, "-m", "rustyflow_py", *argv], ranks, _warn))
    progress = TrainingProgress(cfg.num_epochs)
    try:
        run_training(cfg, progress.say, resume, progress, progress.warn, trace, overwrite,
                     init_from, allow_data_change)
    except Stopped as exc:
        if exc.checkpoint:
            argv = click.get_current_context().find_root().meta["argv"]
            progress.say(f"To continue: {resume_command(argv, exc.checkpoint)}")
        raise
    finally:
        progress.close()


def resume_command(argv: list[str], checkpoint: str) -> str:
    """The command that continues an interrupted run: its own arguments, with `--resume
    checkpoint` in place of the options that start a run afresh."""
    starts = {"--resume", "--init-from"}
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in starts:
            skip = True
        elif arg != "--overwrite" and arg.split("=", 1)[0] not in starts:
            kept.append(arg)
    return f"{command()} {shlex.join([*kept, '--resume', checkpoint])}"


def _warn(message: str) -> None:
    click.echo(message, err=True)


@main.command()
@_train_options
def warmup(config_file: str | None, config: str | None, allow_unknown_keys: bool,
           resume: str | None, trace: str | None, **overrides: Any) -> None:
    """Compile the GPU kernels a training run of this config needs into CuPy's disk cache, so
    that the run itself starts warm. Takes train's options (--resume, --trace, --max-steps,
    --gpus and --processes do not change the kernels); trains nothing and writes no file of
    its own."""
    from .training.run.loop import warm_up

    overrides.pop("processes")
    overrides.update(max_steps=None, num_gpus=None)
    warm_up(_load_run(config, config_file, overrides, allow_unknown_keys), click.echo)


@main.command("eval")
@click.option("--model", "model_path", required=True, type=click.Path(dir_okay=False),
              metavar="CKPT", help="the checkpoint (.npz) to score")
@click.option("--split", type=click.Choice(["valid", "test"]), default="valid", show_default=True,
              help="the dataset split to score")
@click.option("--device", default="auto", metavar="DEVICE", show_default=True,
              help="auto, cpu, gpu or gpu:N")
@click.option("--data-dir", default=None, help="where the dataset lives (DATA_DIR); must exist")
@click.option("--eval-tokens", "budget", type=click.IntRange(min=0), default=0,
              show_default=True, help="score only the first N tokens of the split (0 = all)")
@click.option("--eval-stride", "stride", type=click.IntRange(min=0), default=None,
              help="windows advancing S tokens, each scoring its last S (0: non-overlapping) "
                   "[default: the checkpoint's EVAL_STRIDE]")
@click.option("--adapt", default=None, metavar="cache|dynamic",
              help="adaptive evaluation, reported beside the model alone: the neural cache "
                   "pointer (Grave et al., 2017) or dynamic evaluation (Krause et al., 2018)")
@click.option("--streams", type=int, default=None,
              help="--adapt: read the split as N parallel streams [default: 1, in order]")
@click.option("--cache-window", type=int, default=None,
              help="--adapt cache: positions of the text kept [default: 2000]")
@click.option("--cache-theta", type=float, default=None,
              help="--adapt cache: scale of the hidden-state dot products [default: 0.3]")
@click.option("--cache-lambda", type=float, default=None,
              help="--adapt cache: the cache's weight in the mixture, 0 to 1 [default: 0.1]")
@click.option("--dynamic-lr", type=float, default=None,
              help="--adapt dynamic: SGD step size [default: 0.01]")
@click.option("--dynamic-decay", type=float, default=None,
              help="--adapt dynamic: pull toward the original weights per step, 0 to 1 "
                   "[default: 0]")
@click.option("--dynamic-segment", type=int, default=None,
              help="--adapt dynamic: tokens scored, then learnt from, per step "
                   "[default: 0 = SEQ_LEN]")
def eval_(model_path: str, split: str, device: str, data_dir: str | None, budget: int,
          stride: int | None, adapt: str | None, streams: int | None, **options: Any) -> None:
    """Perplexity of a checkpoint on a split (per token, and per word for subwords); with
    --adapt, also with evaluation-time adaptation (docs/commands.md)."""
    from .reporting.progress import TrainingProgress
    from .reporting.text import on_tokens
    from .training.evaluation.adaptive.run import evaluate_adaptive, method_of, result_lines
    from .training.evaluation.evaluate import evaluate_checkpoint

    method = method_of(adapt, streams, options, stride)
    progress = TrainingProgress(1)
    try:
        if method is None:
            result = evaluate_checkpoint(model_path, split, device, data_dir,
                                         progress.evaluating, budget, stride)
        else:
            result = evaluate_adaptive(model_path, split, device, method, data_dir,
                                       streams or 1, budget, progress.evaluating, stride)
    finally:
        progress.close()
    if method is not None:
        for line in result_lines(result):
            click.echo(line)
        return
    per = " per token" if "word_perplexity" in result else ""
    click.echo(f"{split} perplexity {result['perplexity']:.3f}{per} (mean NLL "
               f"{result['nll']:.4f} on {on_tokens(result['tokens'], result['of'])}, "
               f"{result['protocol']}, {result['device']})")
    if per:
        click.echo(f"{split} perplexity {result['word_perplexity']:.3f} per word of the text "
                   f"(the NLL of its {result['split_tokens']:,} tokens over its "
                   f"{result['words']:,} words)")


_LOG_OPTION = click.option(
    "--log", "logs", multiple=True, type=click.Path(dir_okay=False),
    help="a log to read; repeat to read several together [default: training_log.txt]")


def _read_logs(logs: tuple[str, ...]) -> list[Any]:
    """The runs of every --log, in time order (a log's own order for equal times); each
    log's warnings on stderr. A missing log is an error, never silently skipped."""
    from .reporting.log_parser import read_log

    warnings: list[str] = []
    records = []
    for path in logs or ("training_log.txt",):
        if not Path(path).is_file():
            raise click.ClickException(_missing_log(path, given=bool(logs)))
        records += read_log(path, warnings)
    for w in warnings:
        click.echo(f"WARN: {w}", err=True)
    return sorted(records, key=lambda r: str(r.get("timestamp", ""))) if len(logs) > 1 else records


def _missing_log(path: str, given: bool) -> str:
    """A log that is not there, named as the user gave it (or not: the default, in this
    folder), with the absolute path when it was relative."""
    where = "" if Path(path).is_absolute() else f" (looked for {Path(path).absolute()})"
    if given:
        return (f"{path} not found{where}: pass --log the LOG_FILE a run wrote (relative paths "
                f"are read from the folder you are in)")
    return (f"{path} not found{where}: no run has logged in this folder; run "
            f"`{command()} train` here first, or pass --log FILE")


@main.command()
@_LOG_OPTION
@click.option("--last", type=click.IntRange(min=1), default=None, help="only the last N runs")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]),
              default="table", show_default=True,
              help="table: text fitted to the terminal's width; markdown: for a file or an "
                   "issue; json: the runs' records")
def report(logs: tuple[str, ...], last: int | None, fmt: str) -> None:
    """The runs in the log(s), CPU-vs-GPU speed-ups and the latest profiling report."""
    from .reporting.report_page import render_report, terminal_width

    click.echo(render_report(_read_logs(logs), fmt, last, terminal_width()))


@main.command()
@_LOG_OPTION
@click.option("--out", "folder", default="plots", show_default=True,
              type=click.Path(file_okay=False), help="folder for the PNG and SVG files")
@click.option("--last", type=click.IntRange(min=1), default=None, help="only the last N runs")
@click.option("--run", "runs", multiple=True, metavar="TIMESTAMP",
              help="only the run with this timestamp (repeatable; `report` lists them)")
@click.option("--format", "formats", multiple=True, type=click.Choice(["png", "svg"]),
              help="file format; repeatable [default: png and svg]")
def plot(logs: tuple[str, ...], folder: str, last: int | None, runs: tuple[str, ...],
         formats: tuple[str, ...]) -> None:
    """Pictures of the runs: loss curves, per-op breakdown, CPU vs GPU (needs matplotlib)."""
    from .reporting import plot as pictures

    pictures.pyplot()  # without matplotlib, say how to get it before reading anything
    records = _read_logs(logs)
    written, skipped = pictures.plot_runs(pictures.select(records, last, runs), folder,
                                          formats or pictures.FORMATS)
    for path in written:
        click.echo(f"wrote {path}")
    for reason in skipped:
        click.echo(f"not drawn: {reason}", err=True)
    if not written:
        raise click.ClickException("nothing to draw from the selected runs")


@main.command()
@click.option("--out", "folder", default="bench-results", show_default=True,
              type=click.Path(file_okay=False),
              help="folder for bench.md, bench.json and the speed-up plot")
@click.option("--quick", is_flag=True, help="a tiny grid (seconds): checks, not results")
@click.option("--model", "models", multiple=True, metavar="LxExH",
              help="a model shape, e.g. 2x128x4 (layers x embed x heads); repeatable")
@click.option("--batch", "batches", multiple=True, metavar="BxT",
              help="a batch layout, e.g. 16x64 (batch x seq_len); repeatable")
@click.option("--vocab", type=click.IntRange(min=2), default=33278, show_default=True,
              help="vocabulary size of the timed model (WikiText-2's word vocabulary)")
@click.option("--seconds", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="timed seconds per point and device (at least 3 steps)")
@click.option("--from-json", "saved", type=click.Path(dir_okay=False, exists=True),
              default=None, help="no timing: write bench.md and the plot from a bench.json")
def bench(folder: str, quick: bool, models: tuple[str, ...], batches: tuple[str, ...],
          vocab: int, seconds: float, saved: str | None) -> None:
    """When does the GPU help? Time the training step on CPU and GPU over a grid of sizes."""
    from .training import bench as b

    if saved:
        result = b.load_results(saved)
    else:
        try:
            points = b.requested_grid(models, batches, quick)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        result = b.sweep(points, vocab, seconds, click.echo, _warn)
    report = b.write_results(result, folder, click.echo)
    click.echo(report.read_text(encoding="utf-8"))
    click.echo(f"wrote {report} and {report.with_name('bench.json')}")


@main.group()
def data() -> None:
    """Download or inspect datasets."""


@data.command("download")
@click.argument("dataset", default="wikitext-2")
@click.option("--data-dir", default="data", help="destination folder")
def data_download(dataset: str, data_dir: str) -> None:
    """Download and verify DATASET (wikitext-2 or tinyshakespeare)."""
    from .data import DataError
    from .data.download import download_dataset

    try:
        path = download_dataset(dataset, data_dir)
    except DataError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{dataset} is ready in {path}")


@data.command("info")
@click.argument("dataset", default="wikitext-2")
@click.option("--data-dir", default=None,
              help="the folder to look in (must exist) [default: $RUSTYFLOW_DATA_DIR, then "
                   "./data, then ../shared/data, as train looks]")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def data_info(dataset: str, data_dir: str | None, as_json: bool) -> None:
    """Where DATASET was found, sizes, token counts and checksums; exit 1 if missing or damaged."""
    from .data import DataError, dataset_info, format_info, info_problem

    try:
        info = dataset_info(dataset, data_dir)
    except DataError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(info, indent=2, default=str) if as_json else format_info(info))
    problem = info_problem(info)
    if problem:
        raise click.ClickException(problem)


@main.group("import")
def import_() -> None:
    """Bring a model trained elsewhere in as a rustyflow checkpoint."""


@import_.command("hf")
@click.argument("source", metavar="DIR_OR_NAME")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="the rustyflow checkpoint to write (.npz)")
@click.option("--overwrite", is_flag=True, help="replace a rustyflow checkpoint at --out")
def import_hf(source: str, out: str, overwrite: bool) -> None:
    """A GPT-2 in Hugging Face format (a folder with config.json and model.safetensors, or a
    Hub name such as gpt2) as a rustyflow checkpoint (needs the hf extra)."""
    from .interop.hf_import import import_hf as run

    result = run(source, out, overwrite, _warn)
    cfg = result["config"]
    click.echo(f"wrote {result['path']}: GPT-2 L{cfg.num_layers} H{cfg.num_heads} "
               f"E{cfg.embed_dim}, {cfg.seq_len} positions, {result['params']:,} parameters; "
               f"vocabulary {result['vocabulary']}")


@main.command("export")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["hf"]), required=True,
              help="hf: config.json + model.safetensors for transformers' GPT2LMHeadModel, "
              "and the tokenizer files for its AutoTokenizer")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="the folder to write (created if missing)")
def export(model: str, fmt: str, out: str) -> None:
    """Write checkpoint MODEL in another format (needs the hf extra)."""
    from .interop.hf_export import export_hf

    result = export_hf(model, out, click.echo)
    tokenizer = (f" and transformers.AutoTokenizer.from_pretrained({result['folder']!r})"
                 if "tokenizer.json" in result["files"] else "")
    click.echo(f"{result['params']:,} parameters; load it with "
               f"transformers.GPT2LMHeadModel.from_pretrained({result['folder']!r}){tokenizer}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def devices(as_json: bool) -> None:
    """Which backends are usable here, and why not."""
    from .engine.library import devices_report

    info = devices_report()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    cpu, gpu = info["cpu"], info["gpu"]
    click.echo(f"cpu: usable - {cpu['name']}, {cpu['cores']} cores, numpy {cpu['numpy']}, "
               f"{cpu['blas_library']}, {cpu['threads']} threads (BLAS itself: "
               f"{cpu['blas_threads']} per call), {cpu['kernels']} kernels")
    if cpu["kernels"] == "NumPy":
        click.echo(f"     ({install_command('jit')} adds compiled numba kernels for the "
                   "elementwise passes: 10-20% faster CPU steps in benchmarks/results/)")
    if gpu["usable"]:
        click.echo(f"gpu: usable - {gpu['name']} (compute {gpu['compute_capability']}), "
                   f"{gpu['memory_total'] / 2**30:.1f} GiB, CUDA runtime {gpu['cuda_runtime']}"
                   f" / driver {gpu['cuda_driver']}, CuPy {gpu['cupy']}")
    else:
        click.echo(f"gpu: not usable - {gpu['reason']}")


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def banner(train_args: tuple[str, ...]) -> None:
    """Show what `train TRAIN_ARGS...` would run: the train scripts' banner.

    The arguments are parsed by `train` itself, so the banner cannot drift from the run.
    Config errors stop here, before any work; warnings are printed as train prints them.
    """
    from .data import where_found
    from .reporting.text import plural
    from .training.config.optimizers import describe as describe_optimizer

    with train.make_context(f"{command()} train", list(train_args)) as ctx:
        params = dict(ctx.params)
    config, positional = params.pop("config"), params.pop("config_file")
    resume, trace = params.pop("resume"), params.pop("trace")
    allow_unknown_keys = params.pop("allow_unknown_keys")
    params.pop("overwrite")
    params.pop("processes")
    params.pop("allow_data_change")
    init_from = params.pop("init_from")
    cfg = _load_run(config, positional, _with_init_shape(init_from, resume, params),
                    allow_unknown_keys)
    shown = config or positional or ("config.env" if Path("config.env").is_file() else None)
    cpu_path, gpu_path = cfg.model_path_for("cpu", resume), cfg.model_path_for("gpu", resume)
    model_path = cpu_path if cpu_path == gpu_path else {
        "cpu": cpu_path, "gpu": f"{gpu_path} ({cpu_path} if it falls back to the CPU)",
        "auto": f"{gpu_path} on a usable GPU, else {cpu_path}"}[cfg.device.partition(":")[0]]
    epochs = f"{cfg.num_epochs}" + (f" (stop after {plural(cfg.max_steps, 'step')})"
                                    if cfg.max_steps else "")
    rows = [
        ("config", shown or "none (built-in defaults, environment and flags)"),
        ("dataset", cfg.dataset + (f" (DATA_DIR={cfg.data_dir})" if cfg.data_dir else "")),
        ("found in", where_found(cfg.dataset, cfg.data_dir or None)),
        ("device", cfg.device + (" (strict: no CPU fallback)" if cfg.strict_device else "")),
        ("model", f"L{cfg.num_layers} H{cfg.num_heads} E{cfg.embed_dim}, dropout "
                  f"{cfg.dropout:g}, {cfg.precision}"),
        ("model path", model_path),
        ("epochs", epochs),
        ("batch", str(cfg.batch_size) + (
            f" per process x GRAD_ACCUM_STEPS {cfg.grad_accum_steps} x {cfg.num_gpus} GPU"
            f"{'s' if cfg.num_gpus > 1 else ''} = effective batch "
            f"{cfg.batch_size * cfg.grad_accum_steps * cfg.num_gpus}"
            + (", ZeRO-1 sharded optimizer" if cfg.shard_optimizer else "")
            if cfg.num_gpus > 1 or cfg.grad_accum_steps > 1 else "")),
        ("seq len", str(cfg.seq_len)),
        ("LR", f"{cfg.learning_rate:g} ({cfg.optimizer}, {cfg.warmup_steps} warm-up steps, "
               f"cosine to {cfg.min_lr_ratio:g}x)"),
        ("optimizer", describe_optimizer(cfg)),
        ("log", cfg.log_file),
    ]
    if cfg.device == "cpu":
        kernels = {"auto": "numba kernels when installed", "on": "numba kernels",
                   "off": "NumPy kernels"}[cfg.cpu_jit]
        rows.insert(3, ("cpu", f"threads {cfg.threads or 'all cores'}, "
                               f"CPU_JIT={cfg.cpu_jit} ({kernels})"))
    if resume:
        rows.append(("resume", resume))
    if init_from:
        rows.append(("init from", init_from))
    if trace:
        rows.append(("trace", trace))
    click.echo("RustyFlow train")
    for name, value in rows:
        click.echo(f"  {name:<12}{value}")


_SAMPLING_KEYS = [KEYS[k] for k in ("TEMPERATURE", "TOP_K", "TOP_P", "SEED", "THREADS")]


def _sampling_options(fn: Any) -> Any:
    """Options shared by generate and chat; sampling defaults (and THREADS, the CPU's) come
    from the config file."""
    for key in reversed(_SAMPLING_KEYS):
        fn = click.option(key.flag, key.attr, default=None, metavar=key.type.upper(),
                          help=f"{key.help} [default: config, else {key.default}]")(fn)
    fn = click.option("--quiet", is_flag=True, help="no banner or tokens/s on stderr")(fn)
    fn = click.option("--device", default=None, metavar="DEVICE",
                      help="where to run (any checkpoint loads on either device)")(fn)
    fn = click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
                      help="config file (default: ./config.env when present)")(fn)
    fn = click.option("--max-tokens", type=click.IntRange(min=0), default=100,
                      show_default=True,
                      help="tokens to generate (chat: per reply, which also ends at <eos>)")(fn)
    return click.option("--model", "model_path", default=None,
                        type=click.Path(dir_okay=False),
                        help="checkpoint (.npz) [default: the best checkpoint of the latest "
                             "completed run in the log (of --config's runs when given), else "
                             "the config's MODEL_PATH]")(fn)


def _open_session(model_path: str | None, config: str | None, quiet: bool,
                  prompt_missing: bool = False, samples: int = 1, **overrides: Any) -> Any:
    """Config (flags > env > file), device and checkpoint; user errors as one clear line."""
    from .model.generate import Sampling
    from .training.evaluation.evaluate import open_session
    from .training.outputs.model_choice import choose_model

    cfg = _load(config, overrides)
    say = (lambda msg: None) if quiet else _warn
    path = choose_model(model_path, config, cfg, say, prompt_missing)
    if prompt_missing:
        raise click.UsageError("generate needs --prompt TEXT (the text to continue)")
    return open_session(path, cfg.device, cfg.strict_device,
                        Sampling(cfg.temperature, cfg.top_k, cfg.top_p), cfg.seed, say, _warn,
                        samples, threads=cfg.threads)


@main.command()
@click.option("--prompt", default=None,
              help="text to continue; only a trailing newline ends its line with <eos>")
@click.option("--num-samples", type=click.IntRange(min=1), default=1, show_default=True,
              help="continuations of the prompt generated at once, each with its own random "
                   "stream, printed one after another")
@_sampling_options
def generate(model_path: str | None, prompt: str | None, max_tokens: int, config: str | None,
             quiet: bool, num_samples: int, **overrides: Any) -> None:
    """Continue a prompt with text sampled from a trained model."""
    from .model.generate import generate_text

    session = _open_session(model_path, config, quiet, prompt is None, num_samples,
                            **overrides)
    generate_text(session, prompt, max_tokens, sys.stdout, _notes(quiet))
    if not quiet:
        click.echo(session.speed(), err=True)


def _notes(quiet: bool) -> Any:
    """Where generate and chat write their notes (prompt words outside the vocabulary):
    stderr, or nowhere under --quiet, which keeps stderr empty."""
    import io

    return io.StringIO() if quiet else sys.stderr


@main.command()
@_sampling_options
def chat(model_path: str | None, max_tokens: int, config: str | None, quiet: bool,
         **overrides: Any) -> None:
    """Talk to a trained model: it continues each line you type (exit, quit or Ctrl-D ends)."""
    from .model.generate import chat_loop

    session = _open_session(model_path, config, quiet, **overrides)
    if not quiet:
        click.echo(f"Chatting with {session.path} on {session.model.device}; it continues what "
                   f"you type. exit, quit or Ctrl-D ends.", err=True)
    try:
        chat_loop(session, sys.stdin, sys.stdout, _notes(quiet), max_tokens)
    except KeyboardInterrupt:
        click.echo("", err=True)
    if not quiet:
        click.echo(session.speed(), err=True)
