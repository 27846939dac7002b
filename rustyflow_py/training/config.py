"""Run configuration: one table of keys (KEYS), read from config.env, the environment and flags.

Everything is parsed and validated here, before any work starts, so that a typo in a config file
fails in milliseconds with a message naming the key, the value and where it came from, instead of
minutes into a run. Precedence: command line > environment > config file > built-in default.
"""

from __future__ import annotations

import difflib
import logging
import math
import numbers
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dotenv import dotenv_values

from ..errors import ConfigError

BUILTIN_DATASETS = ("wikitext-2", "tinyshakespeare")
OPTIMIZERS = ("adamw", "adam", "sgd", "lamb", "rmsprop", "adagrad", "adadelta", "muon")
MODEL_PATH_TEMPLATE = "models/${DATASET}-L${NUM_LAYERS}-H${NUM_HEADS}-E${EMBED_DIM}.npz"
_REF = re.compile(r"\$\{([^}:]*)(:-[^}]*)?\}")  # the ${NAME} / ${NAME:-default} syntax of dotenv
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def escape_controls(text: str) -> str:
    """`text` with control and other invisible characters as escapes (\\x1b, \\u202e, \\t).

    Config keys and values are echoed in warnings and errors; a raw escape sequence from a file
    could recolour or rewrite the terminal, and a bidi override could make the line lie.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _error(message: str) -> ConfigError:
    """A ConfigError whose quoted keys and values cannot carry control characters."""
    return ConfigError(escape_controls(message))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


@dataclass(frozen=True)
class Key:
    """One configuration key: how to parse it, its default and its one-line help."""

    name: str
    type: str  # "int" | "float" | "bool" | "str" | "choice" | "device"
    default: object
    help: str
    choices: tuple[str, ...] = ()
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    allow_empty: bool = False
    cli: str = ""  # the command-line flag when it is not the key's name (--gpus)

    @property
    def attr(self) -> str:
        """The Config attribute name."""
        return self.name.lower()

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. --batch-size."""
        return self.cli or "--" + self.name.lower().replace("_", "-")

    @property
    def expect(self) -> str:
        """What a valid value looks like, for error messages and help text."""
        if self.type == "bool":
            return "true or false (also 1/0, yes/no, on/off)"
        if self.type == "choice":
            return "one of " + ", ".join(self.choices)
        if self.type == "device":
            return "one of auto, cpu, gpu, or gpu:N for GPU N"
        if self.type == "str":
            return "a string" if self.allow_empty else "a non-empty string"
        if self.type == "int" and self.lo == 1 and self.hi is None:
            return "a positive integer"
        noun = "an integer" if self.type == "int" else "a finite number"
        if self.lo is None:
            return noun
        if self.hi is None:
            return f"{noun} {'>' if self.lo_open else '>='} {_num(self.lo)}"
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f"{noun} in {left}{_num(self.lo)}, {_num(self.hi)}{right}"

    def parse(self, value: object) -> object:
        """Return the typed value of a string or already-typed value; ValueError if invalid."""
        if self.type == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ValueError(self.expect)
        if self.type == "device":
            text = str(value).strip()
            if not re.fullmatch(r"auto|cpu|gpu(:[0-9]+)?", text):
                raise ValueError(self.expect)
            return text
        if self.type in ("str", "choice"):
            text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
            if (self.choices and text not in self.choices) or (not text and not self.allow_empty):
                raise ValueError(self.expect)
            return text
        if isinstance(value, bool):  # bool is an int subclass: True is not a batch size
            raise ValueError(self.expect)
        number: int | float
        if self.type == "int":
            number = int(value) if isinstance(value, numbers.Integral) else int(str(value))
        else:
            number = float(value) if isinstance(value, numbers.Real) else float(str(value))
            if not math.isfinite(number):
                raise ValueError(self.expect)
        if self.lo is not None and (number < self.lo or (self.lo_open and number == self.lo)):
            raise ValueError(self.expect)
        if self.hi is not None and (number > self.hi or (self.hi_open and number == self.hi)):
            raise ValueError(self.expect)
        return number


def _k(name: str, type_: str, default: object, help_: str, **kw: object) -> tuple[str, Key]:
    return name, Key(name, type_, default, help_, **kw)  # type: ignore[arg-type]


KEYS: dict[str, Key] = dict([
    _k("DATASET", "str", "wikitext-2",
       "wikitext-2, tinyshakespeare, or the path of a UTF-8 text file (split 90/10)"),
    _k("DATA_DIR", "str", "", "folder holding the datasets (must exist); empty = "
       "$RUSTYFLOW_DATA_DIR, then ./data, then ../shared/data", allow_empty=True),
    _k("TOKENIZER", "choice", "word", "word (whitespace words, an end-of-line token per "
       "line), gpt2 (GPT-2's byte-level BPE from TOKENIZER_PATH) or bpe (a byte-level BPE "
       "of BPE_VOCAB tokens trained on the training split); gpt2 and bpe need the hf extra",
       choices=("word", "gpt2", "bpe")),
    _k("TOKENIZER_PATH", "str", "", "TOKENIZER=gpt2: the folder holding GPT-2's vocab.json and "
       "merges.txt (a Hugging Face model folder)", allow_empty=True),
    _k("BPE_VOCAB", "int", 8192, "TOKENIZER=bpe: tokens of the trained BPE (the 256 bytes, "
       "GPT-2's end-of-text token and the merges)", lo=257, hi=2**20),
    _k("SEQ_LEN", "int", 64, "tokens per training window (context length)", lo=1),
    _k("BATCH_SIZE", "int", 16, "parallel token streams per step", lo=1),
    _k("NUM_EPOCHS", "int", 1, "passes over the training tokens", lo=1),
    _k("LEARNING_RATE", "float", 1e-3, "peak learning rate, reached after warm-up", lo=0,
       lo_open=True),
    _k("EMBED_DIM", "int", 128, "model width E; must be divisible by NUM_HEADS", lo=1),
    _k("NUM_HEADS", "int", 4, "attention heads per layer", lo=1),
    _k("NUM_LAYERS", "int", 2, "transformer blocks", lo=1),
    _k("DROPOUT", "float", 0.0, "dropout probability (0 = off); the rate of every site "
       "whose own key is -1", lo=0, hi=1, hi_open=True),
    _k("EMBD_DROPOUT", "float", -1.0, "dropout after the token + position embedding sum "
       "(-1 = DROPOUT)", lo=-1, hi=1, hi_open=True),
    _k("ATTN_DROPOUT", "float", -1.0, "dropout of the attention probabilities (-1 = DROPOUT)",
       lo=-1, hi=1, hi_open=True),
    _k("RESID_DROPOUT", "float", -1.0, "dropout of each block's attention and MLP outputs "
       "before the residual add (-1 = DROPOUT)", lo=-1, hi=1, hi_open=True),
    _k("WORD_DROPOUT", "float", 0.0, "whole-word dropout: drop entire vocabulary rows of the "
       "input embedding for a step, survivors scaled by 1/(1-p) (0 = off)", lo=0, hi=1,
       hi_open=True),
    _k("LOCKED_DROPOUT", "bool", False, "variational dropout: the embedding and residual "
       "dropout sites draw one mask per sequence, shared by all its positions"),
    _k("LABEL_SMOOTHING", "float", 0.0, "label smoothing of the training loss (0 = off); "
       "validation and test perplexity never include it", lo=0, hi=1, hi_open=True),
    _k("EMA_DECAY", "float", 0.0, "evaluate (and keep as the best checkpoint) an "
       "exponential moving average of the weights with this decay (0 = off)", lo=0, hi=1,
       hi_open=True),
    _k("EMA_START", "int", 0, "EMA_DECAY: the step the average starts at (the weights "
       "themselves until then)", lo=0),
    _k("AVERAGE_LAST_K", "int", 0, "evaluate (and keep as the best checkpoint) the mean of "
       "the weights at the last K validations (0 or 1 = off)", lo=0),
    _k("MODEL_PATH", "str", MODEL_PATH_TEMPLATE, "checkpoint path (.npz); -cpu/-gpu is inserted "
       "before .npz for the device used; empty = the default", allow_empty=True),
    _k("TEMPERATURE", "float", 0.8, "sampling temperature for generate/chat (0 = greedy)", lo=0),
    _k("TOP_P", "float", 0.9, "nucleus sampling: smallest token set with this much probability "
       "(1 = off)", lo=0, hi=1, lo_open=True),
    _k("TOP_K", "int", 0, "sample only from the K most likely tokens (0 = off)", lo=0),
    _k("OPTIMIZER", "choice", "adamw", "adamw, adam, sgd, lamb, rmsprop, adagrad, adadelta or "
       "muon (2-D hidden weights; adamw for the rest)", choices=OPTIMIZERS),
    _k("WEIGHT_DECAY", "float", 0.1, "weight decay on tensors with >= 2 dimensions (biases and "
       "LayerNorm exempt): decoupled for adamw, lamb and muon; an L2 term of the gradient for "
       "adam, sgd, rmsprop, adagrad and adadelta, as in torch.optim", lo=0),
    _k("WD_SCHEDULE", "choice", "constant", "weight decay over the run (adamw and muon): "
       "constant WEIGHT_DECAY, or linear / cosine from WEIGHT_DECAY at the start to WD_FINAL "
       "at the last step", choices=("constant", "linear", "cosine")),
    _k("WD_FINAL", "float", 0.0, "WD_SCHEDULE=linear|cosine: the weight decay at the last step",
       lo=0),
    _k("BETA1", "float", 0.9, "adamw, adam, lamb (and muon's adamw part): first-moment decay",
       lo=0, hi=1, hi_open=True),
    _k("BETA2", "float", 0.95, "adamw, adam, lamb (and muon's adamw part): second-moment decay",
       lo=0, hi=1, hi_open=True),
    _k("ADAM_EPS", "float", 1e-8, "epsilon of adamw, adam, lamb, rmsprop (and muon's adamw "
       "part)", lo=0, lo_open=True),
    _k("MOMENTUM", "float", 0.9, "sgd and rmsprop momentum (0 = none)", lo=0, hi=1,
       hi_open=True),
    _k("NESTEROV", "bool", False, "sgd: use Nesterov momentum"),
    _k("CENTERED", "bool", False, "rmsprop: centered (divide by the gradient's estimated "
       "variance, not its second moment)"),
    _k("RMSPROP_ALPHA", "float", 0.99, "rmsprop: decay of the squared-gradient average", lo=0,
       hi=1, hi_open=True),
    _k("INITIAL_ACCUMULATOR", "float", 0.0, "adagrad: starting value of the sum of squared "
       "gradients", lo=0),
    _k("ADAGRAD_EPS", "float", 1e-10, "adagrad: epsilon", lo=0, lo_open=True),
    _k("RHO", "float", 0.9, "adadelta: decay of the squared-gradient and squared-update "
       "averages", lo=0, hi=1, hi_open=True),
    _k("ADADELTA_EPS", "float", 1e-6, "adadelta: epsilon", lo=0, lo_open=True),
    _k("MUON_LR", "float", 0.02, "muon: peak learning rate of the 2-D hidden weights (same "
       "warm-up and cosine; LEARNING_RATE drives the adamw part)", lo=0, lo_open=True),
    _k("MUON_MOMENTUM", "float", 0.95, "muon: momentum of the hidden weights' updates", lo=0,
       hi=1, hi_open=True),
    _k("MUON_NESTEROV", "bool", True, "muon: Nesterov momentum"),
    _k("NS_STEPS", "int", 5, "muon: quintic Newton-Schulz iterations per update", lo=1, hi=50),
    _k("GRAD_CLIP", "float", 1.0, "global gradient-norm clipping threshold (0 = off)", lo=0),
    _k("WARMUP_STEPS", "int", 100, "linear warm-up steps, then cosine decay", lo=0),
    _k("MIN_LR_RATIO", "float", 0.1, "final learning rate as a fraction of LEARNING_RATE",
       lo=0, hi=1),
    _k("SEED", "int", 1337, "random seed for initialisation, dropout and sampling", lo=0,
       hi=2**32 - 1),
    _k("PRECISION", "choice", "fp32", "fp32, tf32 (GPU matmuls only), bf16 or fp16 (GPU "
       "mixed precision; fp16 with dynamic loss scaling) or fp64",
       choices=("fp32", "tf32", "bf16", "fp16", "fp64")),
    _k("ATTENTION", "choice", "auto", "GPU attention: auto (the fused flash-style kernel for "
       "tf32, bf16 and fp16 runs) or materialized (T x T scores and batched GEMMs)",
       choices=("auto", "materialized")),
    _k("DEVICE", "device", "auto", "auto (GPU 0 when usable), cpu, gpu or gpu:N"),
    _k("STRICT_DEVICE", "bool", False, "true: DEVICE=gpu without a usable GPU is an error, "
       "not a CPU fallback"),
    _k("GRAPH", "choice", "auto", "CUDA-graph replay of the training step on the GPU: "
       "auto, on or off", choices=("auto", "on", "off")),
    _k("PROFILE", "bool", True, "collect and report per-op times"),
    _k("PROFILE_MODE", "choice", "auto", "GPU per-op profile: auto or graph (kernel records "
       "of sampled CUDA-graph replays, the step that runs; needs cupti-python) or eager (an "
       "eager window of PROFILE_STEPS steps timed by CUDA events)",
       choices=("auto", "graph", "eager")),
    _k("PROFILE_STEPS", "int", 20, "GPU: the most replays sampled (graph profile), or the "
       "eager steps timed (eager window)", lo=0),
    _k("LOG_FILE", "str", "training_log.txt", "append-only run log with the profiling report"),
    _k("LOG_INTERVAL", "int", 50, "steps between loss read-backs and progress updates", lo=1),
    _k("THREADS", "int", 0, "CPU threads for BLAS and NumPy work (0 = all cores)", lo=0),
    _k("CPU_JIT", "choice", "auto", "CPU: numba kernels for the elementwise passes: auto (when "
       "numba is installed), on (required) or off (pure NumPy)", choices=("auto", "on", "off")),
    _k("EVAL_INTERVAL", "int", 0, "steps between validation runs (0 = once per epoch)", lo=0),
    _k("PATIENCE", "int", 0, "stop after this many validations without a new best (0 = off)",
       lo=0),
    _k("EVAL_STRIDE", "int", 0, "perplexity windows: 0 = non-overlapping SEQ_LEN windows; S = "
       "sliding SEQ_LEN windows advancing S tokens, each token scored once (S <= SEQ_LEN)",
       lo=0),
    _k("EVAL_TOKENS", "int", 0, "evaluate only the first N scored tokens of each split (0 = "
       "all): a quick look, not a comparable result; results say how many were scored",
       lo=0),
    _k("MAX_STEPS", "int", 0, "stop after this many optimizer steps (0 = no limit)", lo=0),
    _k("NUM_GPUS", "int", 1, "data-parallel worker processes on this machine, one per GPU "
       "(rustyflow train --gpus N); each trains BATCH_SIZE streams of every step", lo=1,
       cli="--gpus"),
    _k("GRAD_ACCUM_STEPS", "int", 1, "micro-steps of BATCH_SIZE per optimizer step, their "
       "gradients averaged: the effective batch is BATCH_SIZE x GRAD_ACCUM_STEPS x processes",
       lo=1),
    _k("SHARD_OPTIMIZER", "bool", False, "ZeRO-1: each data-parallel process keeps and updates "
       "only its shard of the optimizer state (elementwise optimizers: not lamb or muon)"),
    _k("BUCKET_MB", "float", 25.0, "data parallel: gradient all-reduce bucket size in MiB "
       "(whole tensors; each bucket starts as soon as backward has finished it)", lo=0,
       lo_open=True),
    _k("COMM_TIMEOUT", "float", 300.0, "data parallel: seconds a rank may go unheard (its "
       "heartbeat) before the others end the job naming it", lo=0, lo_open=True),
])
_D = {key.name: key.default for key in KEYS.values()}


def markdown_table() -> list[str]:
    """docs/configuration.md's key table (header and one row per key), generated from KEYS;
    tests/test_config.py holds the page to it."""
    rows = ["| Key | Flag | Default | Valid values | Meaning |", "|---|---|---|---|---|"]
    for key in KEYS.values():
        flag = (f"`{key.flag}` / `--no-{key.flag[2:]}`" if key.type == "bool"
                else f"`{key.flag}`")
        value = str(key.default).lower() if isinstance(key.default, bool) else key.default
        default = "*(empty)*" if value == "" else f"`{value}`"
        rows.append(f"| `{key.name}` | {flag} | {default} | {key.expect} | {key.help} |")
    return rows


def _where(origin: str, key: str) -> str:
    """Human-readable origin of a value: the file name, environment, command line, ..."""
    if origin.startswith("file:"):
        return origin[len("file:"):]
    if origin == "env":
        return "environment"
    if origin == "cli":
        return f"command line {KEYS[key].flag}" if key in KEYS else "command line"
    return origin


def dataset_stem(dataset: str) -> str:
    """The short dataset name used in default model paths: the name, or a text file's stem."""
    return dataset if dataset in BUILTIN_DATASETS else Path(dataset).stem


@dataclass
class Config:
    """A fully validated run configuration; fields accept strings, which are parsed on creation.

    Build it with load_config() (files, environment, flags) or Config.from_dict() (checkpoints).
    `source` maps each UPPER_CASE key to "default", "file:<path>", "env", "cli" or "checkpoint".
    """

    dataset: str = _D["DATASET"]
    data_dir: str = _D["DATA_DIR"]
    tokenizer: str = _D["TOKENIZER"]
    tokenizer_path: str = _D["TOKENIZER_PATH"]
    bpe_vocab: int = _D["BPE_VOCAB"]
    seq_len: int = _D["SEQ_LEN"]
    batch_size: int = _D["BATCH_SIZE"]
    num_epochs: int = _D["NUM_EPOCHS"]
    learning_rate: float = _D["LEARNING_RATE"]
    embed_dim: int = _D["EMBED_DIM"]
    num_heads: int = _D["NUM_HEADS"]
    num_layers: int = _D["NUM_LAYERS"]
    dropout: float = _D["DROPOUT"]
    embd_dropout: float = _D["EMBD_DROPOUT"]
    attn_dropout: float = _D["ATTN_DROPOUT"]
    resid_dropout: float = _D["RESID_DROPOUT"]
    word_dropout: float = _D["WORD_DROPOUT"]
    locked_dropout: bool = _D["LOCKED_DROPOUT"]
    label_smoothing: float = _D["LABEL_SMOOTHING"]
    ema_decay: float = _D["EMA_DECAY"]
    ema_start: int = _D["EMA_START"]
    average_last_k: int = _D["AVERAGE_LAST_K"]
    model_path: str = _D["MODEL_PATH"]
    temperature: float = _D["TEMPERATURE"]
    top_p: float = _D["TOP_P"]
    top_k: int = _D["TOP_K"]
    optimizer: str = _D["OPTIMIZER"]
    weight_decay: float = _D["WEIGHT_DECAY"]
    wd_schedule: str = _D["WD_SCHEDULE"]
    wd_final: float = _D["WD_FINAL"]
    beta1: float = _D["BETA1"]
    beta2: float = _D["BETA2"]
    adam_eps: float = _D["ADAM_EPS"]
    momentum: float = _D["MOMENTUM"]
    nesterov: bool = _D["NESTEROV"]
    centered: bool = _D["CENTERED"]
    rmsprop_alpha: float = _D["RMSPROP_ALPHA"]
    initial_accumulator: float = _D["INITIAL_ACCUMULATOR"]
    adagrad_eps: float = _D["ADAGRAD_EPS"]
    rho: float = _D["RHO"]
    adadelta_eps: float = _D["ADADELTA_EPS"]
    muon_lr: float = _D["MUON_LR"]
    muon_momentum: float = _D["MUON_MOMENTUM"]
    muon_nesterov: bool = _D["MUON_NESTEROV"]
    ns_steps: int = _D["NS_STEPS"]
    grad_clip: float = _D["GRAD_CLIP"]
    warmup_steps: int = _D["WARMUP_STEPS"]
    min_lr_ratio: float = _D["MIN_LR_RATIO"]
    seed: int = _D["SEED"]
    precision: str = _D["PRECISION"]
    attention: str = _D["ATTENTION"]
    device: str = _D["DEVICE"]
    strict_device: bool = _D["STRICT_DEVICE"]
    graph: str = _D["GRAPH"]
    profile: bool = _D["PROFILE"]
    profile_mode: str = _D["PROFILE_MODE"]
    profile_steps: int = _D["PROFILE_STEPS"]
    log_file: str = _D["LOG_FILE"]
    log_interval: int = _D["LOG_INTERVAL"]
    threads: int = _D["THREADS"]
    cpu_jit: str = _D["CPU_JIT"]
    eval_interval: int = _D["EVAL_INTERVAL"]
    patience: int = _D["PATIENCE"]
    eval_stride: int = _D["EVAL_STRIDE"]
    eval_tokens: int = _D["EVAL_TOKENS"]
    max_steps: int = _D["MAX_STEPS"]
    num_gpus: int = _D["NUM_GPUS"]
    grad_accum_steps: int = _D["GRAD_ACCUM_STEPS"]
    shard_optimizer: bool = _D["SHARD_OPTIMIZER"]
    bucket_mb: float = _D["BUCKET_MB"]
    comm_timeout: float = _D["COMM_TIMEOUT"]
    source: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for key in KEYS.values():
            origin = self.source.setdefault(key.name, "default")
            value = getattr(self, key.attr)
            try:
                setattr(self, key.attr, key.parse(value))
            except ValueError:
                raise _error(f"{_where(origin, key.name)}: {key.name}='{value}' is not "
                             f"valid: expected {key.expect}") from None
        self._check_heads()
        self._check_cross_keys()
        self.model_path = self._expand_model_path(self.model_path or MODEL_PATH_TEMPLATE)

    def _check_heads(self) -> None:
        e, h = self.embed_dim, self.num_heads
        if e % h == 0:
            return
        # divisors near h only: EMBED_DIM may be any size, and its divisors are not listed
        near = range(max(1, h - 1024), min(e, h + 1024) + 1)
        heads = sorted({1, *(d for d in near if e % d == 0)}, key=lambda d: (abs(d - h), d))
        dims = sorted({m for m in (e - e % h, e - e % h + h) if m > 0})
        raise _error(
            f"EMBED_DIM={e} ({_where(self.source['EMBED_DIM'], 'EMBED_DIM')}) is not divisible "
            f"by NUM_HEADS={h} ({_where(self.source['NUM_HEADS'], 'NUM_HEADS')}): expected "
            f"EMBED_DIM to be a multiple of NUM_HEADS (each head gets EMBED_DIM/NUM_HEADS "
            f"dimensions); fix: EMBED_DIM={' or '.join(map(str, dims))}, or NUM_HEADS="
            f"{' or '.join(map(str, heads[:2]))}")

    def _check_cross_keys(self) -> None:
        """Rules between keys, checked here so no run starts with a combination that fails
        later, or that sets an option the chosen optimizer would silently ignore."""
        opt = self.optimizer
        where = {name: _where(self.source[name], name) for name in KEYS}
        for name in ("EMBD_DROPOUT", "ATTN_DROPOUT", "RESID_DROPOUT"):
            value = getattr(self, name.lower())
            if -1 < value < 0:
                raise ConfigError(f"{where[name]}: {name}='{value:g}' is not valid: expected "
                                  "-1 (follow DROPOUT) or a rate in [0, 1)")
        if self.tokenizer == "gpt2" and not self.tokenizer_path and \
                self.source["TOKENIZER"] != "checkpoint":
            raise ConfigError(
                f"TOKENIZER=gpt2 ({where['TOKENIZER']}) reads GPT-2's vocab.json and merges.txt "
                f"from TOKENIZER_PATH, which is empty: set TOKENIZER_PATH to the folder that "
                f"holds them (e.g. a Hugging Face GPT-2 folder)")
        if self.eval_stride > self.seq_len:
            raise ConfigError(
                f"EVAL_STRIDE={self.eval_stride} ({where['EVAL_STRIDE']}) is longer than "
                f"SEQ_LEN={self.seq_len} ({where['SEQ_LEN']}): tokens between windows would "
                f"go unscored; set EVAL_STRIDE to at most {self.seq_len} (0 = non-overlapping)")
        if self.shard_optimizer and opt in ("lamb", "muon"):
            raise ConfigError(
                f"SHARD_OPTIMIZER=true ({where['SHARD_OPTIMIZER']}) needs an elementwise "
                f"optimizer, but OPTIMIZER={opt} ({where['OPTIMIZER']}) works on whole tensors "
                "(LAMB's trust ratio, Muon's orthogonalisation) that a shard splits: set "
                "SHARD_OPTIMIZER=false, or OPTIMIZER=adamw (or adam, sgd, rmsprop, adagrad, "
                "adadelta)")
        self._check_quality_keys(where)
        if self.num_gpus > 1 and self.device == "cpu":
            raise ConfigError(
                f"NUM_GPUS={self.num_gpus} ({where['NUM_GPUS']}) starts one process per GPU, "
                f"but DEVICE=cpu ({where['DEVICE']}): set DEVICE=gpu, or NUM_GPUS=1")
        if self.num_gpus > 1 and ":" in self.device:
            raise ConfigError(
                f"NUM_GPUS={self.num_gpus} ({where['NUM_GPUS']}) gives each process its own "
                f"GPU, but DEVICE={self.device} ({where['DEVICE']}) pins one: set DEVICE=gpu")
        for flag, owner in (("NESTEROV", "sgd"), ("CENTERED", "rmsprop")):
            if getattr(self, flag.lower()) and opt != owner:
                other = " (muon has MUON_NESTEROV)" if flag == "NESTEROV" else ""
                raise ConfigError(
                    f"{flag}=true ({where[flag]}) applies only to OPTIMIZER={owner}, but "
                    f"OPTIMIZER={opt} ({where['OPTIMIZER']}) would ignore it: set {flag}=false "
                    f"or OPTIMIZER={owner}{other}")
        for flag, momentum, owner in (("NESTEROV", "MOMENTUM", "sgd"),
                                      ("MUON_NESTEROV", "MUON_MOMENTUM", "muon")):
            value = getattr(self, momentum.lower())
            if opt == owner and getattr(self, flag.lower()) and value <= 0:
                raise ConfigError(
                    f"{flag}=true ({where[flag]}) needs {momentum} > 0, but {momentum}="
                    f"{value:g} ({where[momentum]}): set {momentum} (e.g. "
                    f"{_D[momentum] if _D[momentum] else 0.9}) or {flag}=false")

    def _check_quality_keys(self, where: dict[str, str]) -> None:
        """Weight averaging is one kind at a time; a decay schedule needs decoupled decay."""
        if self.ema_decay > 0 and self.average_last_k > 1:
            raise ConfigError(
                f"EMA_DECAY={self.ema_decay:g} ({where['EMA_DECAY']}) and AVERAGE_LAST_K="
                f"{self.average_last_k} ({where['AVERAGE_LAST_K']}) both average the weights "
                "for evaluation: choose one (set the other to 0)")
        if self.wd_schedule != "constant" and self.optimizer not in ("adamw", "muon"):
            raise ConfigError(
                f"WD_SCHEDULE={self.wd_schedule} ({where['WD_SCHEDULE']}) schedules decoupled "
                f"weight decay, which OPTIMIZER={self.optimizer} ({where['OPTIMIZER']}) does not "
                "have (its decay is an L2 term, or inside LAMB's trust ratio): use "
                "OPTIMIZER=adamw or muon, or WD_SCHEDULE=constant")

    def _expand_model_path(self, path: str) -> str:
        """Fill ${KEY} placeholders from the final values, so flags change the default path."""
        where = _where(self.source["MODEL_PATH"], "MODEL_PATH")

        def value_of(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in KEYS:
                raise _error(f"{where}: MODEL_PATH='{path}' is not valid: ${{{name}}} is "
                             f"not a config key; expected only {', '.join(KEYS)}")
            if name == "DATASET":
                return dataset_stem(self.dataset)
            return str(getattr(self, name.lower()))

        expanded = _REF.sub(value_of, path)
        if not expanded.endswith(".npz"):
            raise _error(f"{where}: MODEL_PATH='{path}' is not valid: expected a path "
                         f"ending in .npz")
        return expanded

    def model_path_for(self, device: str) -> str:
        """The checkpoint path for the device actually used: '-cpu'/'-gpu' before '.npz'
        (any GPU: gpu:N writes -gpu too)."""
        device = device.partition(":")[0]
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be cpu, gpu or gpu:N, not {device!r}")
        stem = self.model_path[: -len(".npz")]
        return self.model_path if stem.endswith(f"-{device}") else f"{stem}-{device}.npz"

    def to_dict(self) -> dict[str, object]:
        """UPPER_CASE key -> value, JSON-serialisable (stored inside checkpoints)."""
        return {key.name: getattr(self, key.attr) for key in KEYS.values()}

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> Config:
        """Validate a to_dict() mapping (e.g. from a checkpoint); unknown keys are ignored."""
        known = {k: v for k, v in values.items() if k in KEYS}
        return cls(**{KEYS[k].attr: v for k, v in known.items()},  # type: ignore[arg-type]
                   source={k: "checkpoint" for k in known})


class _Collect(logging.Handler):
    """Captures python-dotenv's 'could not parse statement' log lines as our warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _read_file(path: Path, label: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """Return (interpolated values, raw values, warnings) of a dotenv file."""
    collect = _Collect()
    logger = logging.getLogger("dotenv.main")
    logger.addHandler(collect)
    try:
        values = dotenv_values(path, interpolate=True, encoding="utf-8")
        raw = dotenv_values(path, interpolate=False, encoding="utf-8")
    except UnicodeDecodeError as err:
        raise _error(f"{label}: not valid UTF-8 at byte {err.start}: expected a text file "
                     f"of KEY=VALUE lines") from None
    finally:
        logger.removeHandler(collect)
    warnings = [f"{label}: {m}" for m in dict.fromkeys(collect.messages)]
    for key, value in values.items():
        if value is None:
            warnings.append(f"{label}: '{key}' has no value (expected {key}=VALUE); ignored")
    return ({k: v for k, v in values.items() if v is not None},
            {k: v for k, v in raw.items() if v is not None}, warnings)


def _file_warnings(label: str, values: dict[str, str], raw: dict[str, str],
                   config: Config) -> list[str]:
    """Unknown keys, and ${VAR} references that expanded differently from the final config.

    python-dotenv expands ${VAR} from keys earlier in the file, then from os.environ.
    """
    warnings = []
    referenced = {m.group(1) for v in raw.values() for m in _REF.finditer(v)}
    for key in values:
        if key not in KEYS and key not in referenced:
            hint = difflib.get_close_matches(key.upper(), KEYS, n=1)
            tip = f" (did you mean {hint[0]}?)" if hint else ""
            warnings.append(f"{label}: unknown key '{key}' ignored{tip}")
    defined: set[str] = set()
    for key, text in raw.items():
        for match in _REF.finditer(text):
            name, has_default = match.group(1), match.group(2) is not None
            if name not in defined and name not in os.environ and not has_default:
                warnings.append(f"{label}: {key} uses ${{{name}}}, which is set neither earlier "
                                f"in the file nor in the environment, so it expands to ''")
            elif key in KEYS and name in KEYS and (config.source[name] == "cli" or (
                    config.source[name] == "env" and name in defined)):
                warnings.append(
                    f"{label}: {key} uses ${{{name}}}, expanded when the file was read, so "
                    f"{name}={getattr(config, name.lower())} from the "
                    f"{_where(config.source[name], name)} does not change it ({key}="
                    f"{values[key]}); remove {key} from the file to get a default that follows "
                    f"overrides")
        defined.add(key)
    return warnings


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Config, list[str]]:
    """Resolve the configuration: overrides (flags) > environ > file > defaults.

    path=None reads ./config.env when it exists. `overrides` uses UPPER_CASE keys; a None value
    means "flag not given". Only known keys are read from `environ` (default os.environ).
    Returns the validated Config and a list of warnings for the caller to print.
    """
    environ = os.environ if environ is None else environ
    raw_values: dict[str, object] = {}
    source: dict[str, str] = {}
    values: dict[str, str] = {}
    file_raw: dict[str, str] = {}
    warnings: list[str] = []
    label = ""
    if path is None and Path("config.env").is_file():
        path = "config.env"
    if path is not None:
        label = os.fspath(path)
        if not Path(path).is_file():
            raise _error(f"{label}: config file not found (looked for "
                         f"{Path(path).absolute()}): expected a file of KEY=VALUE lines")
        values, file_raw, warnings = _read_file(Path(path), label)
        if not file_raw:
            raise _no_settings(Path(path), label)
        for key in KEYS:
            if key in values:
                raw_values[key], source[key] = values[key], f"file:{label}"
    for key in KEYS:
        if key in environ:
            raw_values[key], source[key] = environ[key], "env"
    for key, value in (overrides or {}).items():
        if key not in KEYS:
            raise _error(f"command line: unknown key '{key}': expected one of "
                         f"{', '.join(KEYS)}")
        if value is not None:
            raw_values[key], source[key] = value, "cli"
    config = Config(**{KEYS[k].attr: v for k, v in raw_values.items()},  # type: ignore[arg-type]
                    source=source)
    _check_dataset(config)
    if label:
        warnings += _file_warnings(label, values, file_raw, config)
    return config, [escape_controls(w) for w in warnings]


def _no_settings(path: Path, label: str) -> ConfigError:
    """A file that sets nothing: running on the defaults would hide an empty or mangled file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    content = [(i, line.strip()) for i, line in enumerate(lines, 1)
               if line.strip() and not line.lstrip().startswith("#")]
    if content:
        what = f"line {content[0][0]} {content[0][1][:60]!r} is not KEY=VALUE"
    else:
        what = "it holds only comments" if any(line.strip() for line in lines) else "it is empty"
    return _error(f"{label}: no KEY=VALUE setting found ({what}): expected lines such as "
                  f"BATCH_SIZE=16. A config file that sets nothing is an error, not a run on "
                  f"the built-in defaults; to run on those, use no config file at all")


def _check_dataset(config: Config) -> None:
    dataset = config.dataset
    if dataset in BUILTIN_DATASETS or Path(dataset).is_file():
        return
    hint = difflib.get_close_matches(dataset, BUILTIN_DATASETS, n=1)
    tip = f" (did you mean {hint[0]}?)" if hint else ""
    raise _error(f"{_where(config.source['DATASET'], 'DATASET')}: DATASET='{dataset}' is not "
                 f"valid: expected {' or '.join(BUILTIN_DATASETS)}, or the path of an "
                 f"existing UTF-8 text file{tip}")
