"""The `rustyflow` command line: a thin layer over importable functions."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .config import KEYS, ConfigError, load_config

_TRAIN_KEYS = [k for k in KEYS.values() if k.name not in ("DEVICE", "PROFILE", "SEED",
                                                           "MAX_STEPS")]


def _hyperparameter_options(fn: Any) -> Any:
    """One --<key> option per config key (values are validated by load_config)."""
    for key in reversed(_TRAIN_KEYS):
        if key.type == "bool":
            name = key.flag[2:]
            fn = click.option(f"--{name}/--no-{name}", key.attr, default=None,
                              help=key.help)(fn)
        else:
            fn = click.option(key.flag, key.attr, default=None, metavar=key.type.upper(),
                              help=f"{key.help} [default: {key.default}]")(fn)
    return fn


def _load(config: str | None, overrides: dict[str, Any]) -> Any:
    try:
        cfg, warnings = load_config(config, {k.upper(): v for k, v in overrides.items()})
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    for w in warnings:
        click.echo(f"WARN: {w}", err=True)
    return cfg


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """RustyFlow: train a GPT on WikiText-2 with a from-scratch engine on NumPy or CuPy."""


@main.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
              help="config file (default: ./config.env when present)")
@click.option("--device", type=click.Choice(["cpu", "gpu", "auto"]), default=None)
@click.option("--resume", type=click.Path(dir_okay=False, exists=True), default=None,
              help="continue exactly from a checkpoint written by train")
@click.option("--max-steps", "max_steps", type=int, default=None,
              help="stop after N optimizer steps (the LR schedule is unchanged)")
@click.option("--profile/--no-profile", default=None, help="per-op timing report")
@click.option("--seed", type=int, default=None)
@_hyperparameter_options
def train(config: str | None, resume: str | None, **overrides: Any) -> None:
    """Train a GPT; append the profiling report to the log."""
    from .progress import TrainingProgress
    from .train import TrainingError
    from .train import train as run_training

    cfg = _load(config, overrides)
    progress = TrainingProgress(cfg.num_epochs)
    try:
        run_training(cfg, resume=resume, progress=progress)
    except TrainingError as exc:
        progress.close()
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        progress.close()
        sys.exit(130)
    except Exception as exc:
        progress.close()
        _friendly(exc)
        raise
    progress.close()


def _friendly(exc: Exception) -> None:
    """Turn the errors a user can fix into one clear line (GPU OOM, missing data, ...)."""
    from .backend import DeviceError
    from .checkpoint import CheckpointError
    from .data import DataError

    if isinstance(exc, DataError | DeviceError | CheckpointError):
        raise click.ClickException(str(exc)) from None
    if type(exc).__name__ == "OutOfMemoryError":
        raise click.ClickException(
            f"GPU out of memory: {exc}. Reduce BATCH_SIZE, SEQ_LEN or EMBED_DIM/NUM_LAYERS"
        ) from None


@main.command("eval")
@click.option("--model", "model_path", required=True, type=click.Path(dir_okay=False))
@click.option("--split", type=click.Choice(["valid", "test"]), default="valid")
@click.option("--device", type=click.Choice(["cpu", "gpu", "auto"]), default="auto")
@click.option("--data-dir", default=None, help="where the dataset lives (DATA_DIR)")
def eval_(model_path: str, split: str, device: str, data_dir: str | None) -> None:
    """Word-level perplexity of a checkpoint on a split."""
    from .evaluate import evaluate_checkpoint

    try:
        result = evaluate_checkpoint(model_path, split, device, data_dir)
    except Exception as exc:
        _friendly(exc)
        raise
    click.echo(f"{split} perplexity {result['perplexity']:.3f} (mean NLL "
               f"{result['nll']:.4f} over {result['tokens']} tokens, {result['device']})")


@main.command()
@click.option("--log", "log_path", default="training_log.txt", type=click.Path(dir_okay=False))
@click.option("--last", type=click.IntRange(min=1), default=None, help="only the last N runs")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]),
              default="table")
def report(log_path: str, last: int | None, fmt: str) -> None:
    """The runs in the log, CPU-vs-GPU speed-ups and the latest profiling report."""
    from . import report as rep

    warnings: list[str] = []
    try:
        records = rep.read_log(log_path, warnings)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    for w in warnings:
        click.echo(f"WARN: {w}", err=True)
    click.echo(rep.render_report(records, fmt, last))


@main.group()
def data() -> None:
    """Download or inspect datasets."""


@data.command("download")
@click.argument("dataset", default="wikitext-2")
@click.option("--data-dir", default="data", help="destination folder")
def data_download(dataset: str, data_dir: str) -> None:
    """Download and verify DATASET (wikitext-2 or tinyshakespeare)."""
    from .data import DataError, download_dataset

    try:
        path = download_dataset(dataset, data_dir)
    except DataError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{dataset} is ready in {path}")


@data.command("info")
@click.argument("dataset", default="wikitext-2")
@click.option("--data-dir", default=None)
def data_info(dataset: str, data_dir: str | None) -> None:
    """Where DATASET was found, sizes, token counts and checksums."""
    from .data import DataError, dataset_info

    try:
        info = dataset_info(dataset, data_dir)
    except DataError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(info, indent=2, default=str))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def devices(as_json: bool) -> None:
    """Which backends are usable here, and why not."""
    from .devices import devices_report

    info = devices_report()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    cpu, gpu = info["cpu"], info["gpu"]
    click.echo(f"cpu: usable - {cpu['name']}, {cpu['cores']} cores, numpy {cpu['numpy']}, "
               f"{cpu['blas_library']} with {cpu['blas_threads']} threads")
    if gpu["usable"]:
        click.echo(f"gpu: usable - {gpu['name']} (compute {gpu['compute_capability']}), "
                   f"{gpu['memory_total'] / 2**30:.1f} GiB, CUDA runtime {gpu['cuda_runtime']}"
                   f" / driver {gpu['cuda_driver']}, CuPy {gpu['cupy']}")
    else:
        click.echo(f"gpu: not usable - {gpu['reason']}")
