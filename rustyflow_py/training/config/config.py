"""Run configuration: every key declared once, as a field of `Config`; read from config.env,
the environment and flags.

The declaration is the `Config` class body: `batch_size: int = key(16, "help", lo=1)` gives the
key BATCH_SIZE its type, default, valid range, help text and flag. Everything else derives from
it: `KEYS` (read back from the fields), the parsing of files, environment and flags here, the
`train`/`warmup` options in cli.py, `markdown_table()` (docs/configuration.md's table) and the
`config.env` entry that `scripts/sync_config_docs.py` writes for a new key. Adding a key is one
`key(...)` line below, then that script; docs/configuration.md says so too.

Everything is parsed and validated here, before any work starts, so that a typo in a config file
fails in milliseconds with a message naming the key, the value and where it came from, instead of
minutes into a run. Precedence: command line > environment > config file > built-in default.

Why not pydantic-settings: it merges its sources without recording which one supplied a value,
and every error here names it ("run.env: BATCH_SIZE='abc' is not valid", "command line
--seed: ..."); its validation messages ("Input should be a valid integer") would all need
translating back; and its lax parsing accepts what this product refuses (BATCH_SIZE=1.0 as 1,
PROFILE=t or y as true), so switching would change behaviour the tests pin. The parser is the
`Key` class (config_key.py), a few dozen lines; python-dotenv stays the file reader.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from ...errors import ConfigError
from .config_file import no_settings, read_file
from .config_key import Key, config_error, escape_controls, key

__all__ = ["BUILTIN_DATASETS", "KEYS", "OPTIMIZERS", "Config", "ConfigError", "Key",
           "check_data_dir", "dataset_stem", "escape_controls", "load_config", "markdown_table"]

BUILTIN_DATASETS = ("wikitext-2", "tinyshakespeare")
OPTIMIZERS = ("adamw", "adam", "sgd", "lamb", "rmsprop", "adagrad", "adadelta", "muon")
MODEL_PATH_TEMPLATE = "models/${DATASET}-L${NUM_LAYERS}-H${NUM_HEADS}-E${EMBED_DIM}.npz"
_CHECKOUT = Path(__file__).resolve().parents[3]  # its configs/ are offered for a missing file
_REF = re.compile(r"\$\{([^}:]*)(:-[^}]*)?\}")  # the ${NAME} / ${NAME:-default} syntax of dotenv


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


class _Rules:
    """What `Config` does with its declared fields: parse them on creation, check the rules
    between keys, expand MODEL_PATH, convert to and from a checkpoint's mapping. Kept apart
    from the declaration so that `Config`'s body is the key table and nothing else."""

    def __post_init__(self) -> None:
        for k in KEYS.values():
            origin = self.source.setdefault(k.name, "default")
            value = getattr(self, k.attr)
            try:
                setattr(self, k.attr, k.parse(value))
            except ValueError:
                raise config_error(f"{_where(origin, k.name)}: {k.name}='{value}' is not "
                             f"valid: expected {k.expect}") from None
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
        raise config_error(
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
        self._check_attention(where)
        self._check_inert_keys(where)
        if self.num_gpus > 1 and self.device == "cpu":
            raise ConfigError(
                f"NUM_GPUS={self.num_gpus} ({where['NUM_GPUS']}) starts one process per GPU, "
                f"but DEVICE=cpu ({where['DEVICE']}): set DEVICE=gpu, or NUM_GPUS=1 (--processes "
                f"{self.num_gpus} starts that many processes on the CPU)")
        if self.adam_state_dtype == "bf16" and (self.device == "cpu"
                                                or opt not in ("adamw", "adam", "muon")):
            on = (f"DEVICE=cpu ({where['DEVICE']})" if self.device == "cpu"
                  else f"OPTIMIZER={opt} ({where['OPTIMIZER']})")
            raise ConfigError(
                f"ADAM_STATE_DTYPE=bf16 ({where['ADAM_STATE_DTYPE']}) keeps Adam's moments in "
                f"bf16 on the GPU, for adamw, adam and muon, but {on}: set "
                "ADAM_STATE_DTYPE=fp32, or DEVICE=gpu and one of those optimizers")
        if self.adam_state_dtype == "bf16" and self.shard_optimizer:
            raise ConfigError(
                f"ADAM_STATE_DTYPE=bf16 ({where['ADAM_STATE_DTYPE']}) with SHARD_OPTIMIZER=true "
                f"({where['SHARD_OPTIMIZER']}): ZeRO-1's shards of bf16 moments have not run on "
                "a GPU yet, so the pair is refused; set ADAM_STATE_DTYPE=fp32, or "
                "SHARD_OPTIMIZER=false")
        if self.grad_reduce_dtype == "bf16" and self.device == "cpu":
            raise ConfigError(
                f"GRAD_REDUCE_DTYPE=bf16 ({where['GRAD_REDUCE_DTYPE']}) sums the gradient in "
                f"NCCL's bf16, but DEVICE=cpu ({where['DEVICE']}), where MPI sums float32 "
                "only: set GRAD_REDUCE_DTYPE=fp32, or DEVICE=gpu")
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
                    f"{KEYS[momentum].default or 0.9}) or {flag}=false")

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

    def _check_inert_keys(self, where: dict[str, str]) -> None:
        """A key that changes nothing in this run (Key.needs), asked for with another value
        than its default on the command line or in the environment, is an error. From a
        file or a checkpoint it is let be: a config file lists every key, and a checkpoint
        stores the defaults of its day (FP8_SCALING was current before delayed)."""
        values = self.to_dict()
        for k in KEYS.values():
            if (k.applies(values) or values[k.name] == k.default
                    or self.source[k.name] not in ("env", "cli")):
                continue
            need, want = k.needs
            raise ConfigError(
                f"{k.name}={values[k.name]} ({where[k.name]}) {k.does}, but "
                f"{need}={values[need]} ({where[need]}) makes none: set {need}={want}, or "
                f"leave {k.name}={k.default} (its default)")

    def _check_attention(self, where: dict[str, str]) -> None:
        """ATTENTION=cudnn is cuDNN's SDPA: 16-bit inputs, no dropout of its own kind, head
        dims that are multiples of 8 up to 128."""
        if self.attention != "cudnn":
            return
        head = self.embed_dim // self.num_heads
        p = self.attn_dropout if self.attn_dropout >= 0 else self.dropout
        asked = f"ATTENTION=cudnn ({where['ATTENTION']}) runs cuDNN's fused attention"
        if self.precision not in ("bf16", "fp16", "fp8"):
            raise ConfigError(f"{asked}, which takes 16-bit inputs, but PRECISION="
                              f"{self.precision} ({where['PRECISION']}): set PRECISION=bf16 or "
                              "fp16, or ATTENTION=auto")
        if p > 0:
            rate = (f"ATTN_DROPOUT={p:g} ({where['ATTN_DROPOUT']})" if self.attn_dropout >= 0
                    else f"DROPOUT={p:g} ({where['DROPOUT']}), which ATTN_DROPOUT=-1 follows")
            raise ConfigError(f"{asked}, which cannot draw RustyFlow's dropout masks, but the "
                              f"attention dropout is {p:g} ({rate}): set ATTN_DROPOUT=0, or "
                              "ATTENTION=auto (the own kernel drops inside)")
        if head % 8 or head > 128:
            e, h = self.embed_dim, self.num_heads
            heads = sorted((e // d for d in range(8, 129, 8) if e % d == 0),
                           key=lambda n: (abs(n - h), n))
            dims = sorted({h * min(max(d, 8), 128) for d in (head - head % 8, head - head % 8 + 8)})
            fix = (f"NUM_HEADS={' or '.join(map(str, heads[:2]))} (at EMBED_DIM={e}), or "
                   if heads else "")
            raise ConfigError(
                f"{asked}, which takes head dims that are multiples of 8 up to 128, but "
                f"EMBED_DIM/NUM_HEADS = {head}, from EMBED_DIM={e} ({where['EMBED_DIM']}) and "
                f"NUM_HEADS={h} ({where['NUM_HEADS']}): set {fix}EMBED_DIM="
                f"{' or '.join(map(str, dims))} (at NUM_HEADS={h}), or ATTENTION=auto")

    def _expand_model_path(self, path: str) -> str:
        """Fill ${KEY} placeholders from the final values, so flags change the default path."""
        where = _where(self.source["MODEL_PATH"], "MODEL_PATH")

        def value_of(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in KEYS:
                raise config_error(f"{where}: MODEL_PATH='{path}' is not valid: ${{{name}}} is "
                             f"not a config key; expected only {', '.join(KEYS)}")
            if name == "DATASET":
                return dataset_stem(self.dataset)
            return str(getattr(self, name.lower()))

        expanded = _REF.sub(value_of, path)
        if not expanded.endswith(".npz"):
            raise config_error(f"{where}: MODEL_PATH='{path}' is not valid: expected a path "
                         f"ending in .npz")
        return expanded

    def model_path_for(self, device: str, resume: str | None = None) -> str:
        """Where a run on `device` (cpu, gpu or gpu:N) writes its checkpoint, the one rule:
        a MODEL_PATH typed on the command line is used exactly as typed, so `--resume` finds
        it again under the name the user gave; else a run resumed from `resume` goes on
        writing that file; else the configured path (config file, environment or the default
        template) gets '-cpu' or '-gpu' before '.npz' for the device used (any GPU: '-gpu'),
        so CPU and GPU runs of one config keep their own checkpoints."""
        device = device.partition(":")[0]
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be cpu, gpu or gpu:N, not {device!r}")
        if self.source.get("MODEL_PATH") == "cli":
            return self.model_path
        if resume is not None:
            return resume
        stem = self.model_path[: -len(".npz")]
        return self.model_path if stem.endswith(f"-{device}") else tagged(self.model_path,
                                                                           device)

    def to_dict(self) -> dict[str, object]:
        """UPPER_CASE key -> value, JSON-serialisable (stored inside checkpoints)."""
        return {key.name: getattr(self, key.attr) for key in KEYS.values()}

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> Config:
        """Validate a to_dict() mapping (e.g. from a checkpoint); unknown keys are ignored."""
        known = {k: v for k, v in values.items() if k in KEYS}
        return cls(**{KEYS[k].attr: v for k, v in known.items()},  # type: ignore[arg-type]
                   source={k: "checkpoint" for k in known})



def tagged(path: str, tag: str) -> str:
    """`path` with `-tag` before its `.npz` (`models/q.npz`, `cpu` -> `models/q-cpu.npz`):
    the file a configured MODEL_PATH is written as on a device, or a run's best checkpoint."""
    stem = path[: -len(".npz")] if path.endswith(".npz") else path
    return f"{stem}-{tag}.npz"

@dataclass
class Config(_Rules):
    """A fully validated run configuration; fields accept strings, which are parsed on creation.

    Build it with load_config() (files, environment, flags) or Config.from_dict() (checkpoints).
    `source` maps each UPPER_CASE key to "default", "file:<path>", "env", "cli" or "checkpoint".
    The fields below are the one declaration of every key (see the module docstring).
    """

    dataset: str = key("wikitext-2",
        "wikitext-2, tinyshakespeare, or the path of a UTF-8 text file (split 90/10)")
    data_dir: str = key("", "folder holding the datasets (must exist); empty = "
        "$RUSTYFLOW_DATA_DIR, then ./data, then ../shared/data", allow_empty=True)
    tokenizer: str = key("word", "word (whitespace words, an end-of-line token per "
        "line), gpt2 (GPT-2's byte-level BPE from TOKENIZER_PATH) or bpe (a byte-level BPE "
        "of BPE_VOCAB tokens trained on the training split); gpt2 and bpe need the hf extra",
        choices=("word", "gpt2", "bpe"))
    tokenizer_path: str = key("", "TOKENIZER=gpt2: the folder holding GPT-2's vocab.json and "
        "merges.txt (a Hugging Face model folder)", allow_empty=True)
    bpe_vocab: int = key(8192, "TOKENIZER=bpe: tokens of the trained BPE (the 256 bytes, "
        "GPT-2's end-of-text token and the merges)", lo=257, hi=2**20)
    seq_len: int = key(64, "tokens per training window (context length)", lo=1)
    batch_size: int = key(16, "parallel token streams per step", lo=1)
    num_epochs: int = key(1, "passes over the training tokens", lo=1)
    learning_rate: float = key(1e-3, "peak learning rate, reached after warm-up", lo=0,
        lo_open=True)
    embed_dim: int = key(128, "model width E; must be divisible by NUM_HEADS", lo=1)
    num_heads: int = key(4, "attention heads per layer", lo=1)
    num_layers: int = key(2, "transformer blocks", lo=1)
    dropout: float = key(0.0, "dropout probability (0 = off); the rate of every site "
        "whose own key is -1", lo=0, hi=1, hi_open=True)
    embd_dropout: float = key(-1.0, "dropout after the token + position embedding sum "
        "(-1 = DROPOUT)", lo=-1, hi=1, hi_open=True)
    attn_dropout: float = key(-1.0, "dropout of the attention probabilities (-1 = DROPOUT)",
        lo=-1, hi=1, hi_open=True)
    resid_dropout: float = key(-1.0, "dropout of each block's attention and MLP outputs "
        "before the residual add (-1 = DROPOUT)", lo=-1, hi=1, hi_open=True)
    word_dropout: float = key(0.0, "whole-word dropout: drop entire vocabulary rows of the "
        "input embedding for a step, survivors scaled by 1/(1-p) (0 = off)", lo=0, hi=1,
        hi_open=True)
    locked_dropout: bool = key(False, "variational dropout: the embedding and residual "
        "dropout sites draw one mask per sequence, shared by all its positions")
    random_offsets: bool = key(False, "each epoch reads every training stream from its own "
        "random offset in [0, SEQ_LEN) (drawn from SEED and the epoch), so the windows' "
        "boundaries move between epochs; an epoch has one window fewer")
    label_smoothing: float = key(0.0, "label smoothing of the training loss (0 = off); "
        "validation and test perplexity never include it", lo=0, hi=1, hi_open=True)
    ema_decay: float = key(0.0, "evaluate (and keep as the best checkpoint) an "
        "exponential moving average of the weights with this decay (0 = off)", lo=0, hi=1,
        hi_open=True)
    ema_start: int = key(0, "EMA_DECAY: the step the average starts at (the weights "
        "themselves until then)", lo=0)
    average_last_k: int = key(0, "evaluate (and keep as the best checkpoint) the mean of "
        "the weights at the last K validations (0 or 1 = off)", lo=0)
    model_path: str = key(MODEL_PATH_TEMPLATE, "checkpoint path (.npz); from a config file or "
        "the environment, -cpu/-gpu is inserted before .npz for the device used (--model-path "
        "is used as typed; --resume writes the file it resumes); empty = the default",
        allow_empty=True)
    temperature: float = key(0.8, "sampling temperature for generate/chat (0 = greedy)", lo=0)
    top_p: float = key(0.9, "nucleus sampling: smallest token set with this much probability "
        "(1 = off)", lo=0, hi=1, lo_open=True)
    top_k: int = key(0, "sample only from the K most likely tokens (0 = off)", lo=0)
    optimizer: str = key("adamw", "adamw, adam, sgd, lamb, rmsprop, adagrad, adadelta or "
        "muon (2-D hidden weights; adamw for the rest)", choices=OPTIMIZERS)
    weight_decay: float = key(0.1, "weight decay on tensors with >= 2 dimensions (biases and "
        "LayerNorm exempt): decoupled for adamw, lamb and muon; an L2 term of the gradient for "
        "adam, sgd, rmsprop, adagrad and adadelta, as in torch.optim", lo=0)
    wd_schedule: str = key("constant", "weight decay over the run (adamw and muon): "
        "constant WEIGHT_DECAY, or linear / cosine from WEIGHT_DECAY at the start to WD_FINAL "
        "at the last step", choices=("constant", "linear", "cosine"))
    wd_final: float = key(0.0, "WD_SCHEDULE=linear|cosine: the weight decay at the last step",
        lo=0)
    beta1: float = key(0.9, "adamw, adam, lamb (and muon's adamw part): first-moment decay",
        lo=0, hi=1, hi_open=True)
    beta2: float = key(0.95, "adamw, adam, lamb (and muon's adamw part): second-moment decay",
        lo=0, hi=1, hi_open=True)
    adam_eps: float = key(1e-8, "epsilon of adamw, adam, lamb, rmsprop (and muon's adamw "
        "part)", lo=0, lo_open=True)
    momentum: float = key(0.9, "sgd and rmsprop momentum (0 = none)", lo=0, hi=1,
        hi_open=True)
    nesterov: bool = key(False, "sgd: use Nesterov momentum")
    centered: bool = key(False, "rmsprop: centered (divide by the gradient's estimated "
        "variance, not its second moment)")
    rmsprop_alpha: float = key(0.99, "rmsprop: decay of the squared-gradient average", lo=0,
        hi=1, hi_open=True)
    initial_accumulator: float = key(0.0, "adagrad: starting value of the sum of squared "
        "gradients", lo=0)
    adagrad_eps: float = key(1e-10, "adagrad: epsilon", lo=0, lo_open=True)
    rho: float = key(0.9, "adadelta: decay of the squared-gradient and squared-update "
        "averages", lo=0, hi=1, hi_open=True)
    adadelta_eps: float = key(1e-6, "adadelta: epsilon", lo=0, lo_open=True)
    muon_lr: float = key(0.02, "muon: peak learning rate of the 2-D hidden weights (same "
        "warm-up and cosine; LEARNING_RATE drives the adamw part)", lo=0, lo_open=True)
    muon_momentum: float = key(0.95, "muon: momentum of the hidden weights' updates", lo=0,
        hi=1, hi_open=True)
    muon_nesterov: bool = key(True, "muon: Nesterov momentum")
    ns_steps: int = key(5, "muon: quintic Newton-Schulz iterations per update", lo=1, hi=50)
    grad_clip: float = key(1.0, "global gradient-norm clipping threshold (0 = off)", lo=0)
    warmup_steps: int = key(100, "linear warm-up steps, then cosine decay", lo=0)
    min_lr_ratio: float = key(0.1, "final learning rate as a fraction of LEARNING_RATE",
        lo=0, hi=1)
    seed: int = key(1337, "random seed for initialisation, dropout and sampling", lo=0,
        hi=2**32 - 1)
    precision: str = key("fp32", "fp32, tf32 (GPU matmuls only), bf16 or fp16 (GPU "
        "mixed precision; fp16 with dynamic loss scaling), fp8 (bf16 with the Linear layers' "
        "GEMMs in FP8; GPUs of compute capability 8.9+) or fp64",
        choices=("fp32", "tf32", "bf16", "fp16", "fp8", "fp64"))
    # delayed: as good as current on the quality recipe, and faster
    # (benchmarks/results/fp8-h200.md)
    fp8_scaling: str = key("delayed", "PRECISION=fp8's scaling of each tensor cast "
        "to FP8: delayed (in the replayed CUDA graph, by the amax the same cast measured in "
        "the step before, taken while casting; faster, and the GELU backward and the "
        "LayerNorms next to a Linear write their FP8 themselves) or current (an amax pass "
        "over the tensor first)",
        choices=("delayed", "current"), needs=("PRECISION", "fp8"), does="scales FP8 casts")
    attention: str = key("auto", "GPU attention: own (the fused flash-style kernel for "
        "tf32, bf16 and fp16 runs), cudnn (cuDNN's fused SDPA: bf16/fp16 without attention "
        "dropout; the cudnn extra), auto (cudnn where installed and it applies and the step "
        "is a replayed CUDA graph, else own) or materialized (T x T scores and batched GEMMs)",
        choices=("auto", "own", "cudnn", "materialized"))
    lm_head_chunk: int = key(0, "rows of the tied LM head made at a time: 0 makes the "
        "logits of all BATCH_SIZE x SEQ_LEN rows at once (the fastest); N holds only N rows' "
        "logits (N x vocabulary), each chunk's gradients made in the forward, for a larger "
        "batch in the same memory", lo=0)
    device: str = key("auto", "auto (GPU 0 when usable), cpu, gpu or gpu:N", kind="device")
    strict_device: bool = key(False, "true: DEVICE=gpu without a usable GPU is an error, "
        "not a CPU fallback")
    graph: str = key("auto", "CUDA-graph replay of the training step on the GPU: "
        "auto, on or off", choices=("auto", "on", "off"))
    profile: bool = key(True, "collect and report per-op times")
    profile_mode: str = key("auto", "GPU per-op profile: auto or graph (kernel records "
        "of sampled CUDA-graph replays, the step that runs; needs cupti-python) or eager (an "
        "eager window of PROFILE_STEPS steps timed by CUDA events)",
        choices=("auto", "graph", "eager"))
    profile_steps: int = key(20, "GPU: the most replays sampled (graph profile), or the "
        "eager steps timed (eager window)", lo=0)
    log_file: str = key("training_log.txt", "append-only run log with the profiling report")
    log_interval: int = key(50, "steps between loss read-backs and progress updates", lo=1)
    threads: int = key(0, "CPU threads for BLAS and NumPy work (0 = all cores)", lo=0)
    cpu_jit: str = key("auto", "CPU: numba kernels for the elementwise passes: auto (when "
        "numba is installed), on (required) or off (pure NumPy)", choices=("auto", "on", "off"))
    eval_interval: int = key(0, "steps between validation runs (0 = once per epoch)", lo=0)
    patience: int = key(0, "stop after this many validations without a new best (0 = off)",
        lo=0)
    eval_stride: int = key(0, "perplexity windows: 0 = non-overlapping SEQ_LEN windows; S = "
        "sliding SEQ_LEN windows advancing S tokens, each token scored once (S <= SEQ_LEN)",
        lo=0)
    eval_tokens: int = key(0, "evaluate only the first N scored tokens of each split (0 = "
        "all): a quick look, not a comparable result; results say how many were scored",
        lo=0)
    max_steps: int = key(0, "stop after this many optimizer steps (0 = no limit; the learning-rate "
        "schedule is unchanged)", lo=0)
    num_gpus: int = key(1, "data-parallel worker processes on this machine, one per GPU "
        "(rustyflow train --gpus N); each trains BATCH_SIZE streams of every step", lo=1,
        cli="--gpus")
    grad_accum_steps: int = key(1, "micro-steps of BATCH_SIZE per optimizer step, their "
        "gradients averaged: the effective batch is BATCH_SIZE x GRAD_ACCUM_STEPS x processes",
        lo=1)
    shard_optimizer: bool = key(False, "ZeRO-1: each data-parallel process keeps and updates "
        "only its shard of the optimizer state (elementwise optimizers: not lamb or muon); in "
        "bf16 or fp16 without weight averaging the processes all-gather the 16-bit compute "
        "copy, not the fp32 weights")
    bucket_mb: float = key(25.0, "data parallel: gradient all-reduce bucket size in MiB "
        "(whole tensors; each bucket starts as soon as backward has finished it)", lo=0,
        lo_open=True)
    adam_state_dtype: str = key("fp32", "GPU: the dtype of AdamW's and Adam's moments (and "
        "of Muon's AdamW part): fp32, or bf16 (half their memory and traffic, widened for each "
        "update and rounded back stochastically; float32 parameters and gradients kept; not "
        "with SHARD_OPTIMIZER yet)",
        choices=("fp32", "bf16"))
    grad_reduce_dtype: str = key("fp32", "data parallel (GPU): the dtype the gradient is "
        "summed over the processes in: fp32 (the gradient's own dtype), or bf16 (half the "
        "bytes; each bucket is cast to bf16 for NCCL's sum, as PyTorch DDP's bf16 hook does, "
        "and AdamW/Adam read the sum as it is, other optimizers widened back into the "
        "gradient; BUCKET_MB counts bf16 bytes)",
        choices=("fp32", "bf16"))
    comm_timeout: float = key(300.0, "data parallel: seconds a rank may go unheard (its "
        "heartbeat) before the others end the job naming it", lo=0, lo_open=True)
    source: dict[str, str] = field(default_factory=dict, compare=False, repr=False)


KEYS: dict[str, Key] = {f.name.upper(): Key.of_field(f) for f in fields(Config)
                        if "key" in f.metadata}


def markdown_table() -> list[str]:
    """docs/configuration.md's key table (header and one row per key), generated from KEYS;
    tests/test_config.py holds the page to it and scripts/sync_config_docs.py rewrites it."""
    return ["| Key | Flag | Default | Valid values | Meaning |", "|---|---|---|---|---|",
            *(k.markdown_row() for k in KEYS.values())]


def _unknown_keys(label: str, values: dict[str, str], raw: dict[str, str],
                  lines: dict[str, int], allow: bool) -> list[str]:
    """Keys the file sets that are no config key (nor a helper that a ${VAR} reads): an error
    naming each, its line and the nearest key, because a misspelt key would leave its
    setting at the default unnoticed (BATCHSIZE=8 trains at 16); with `allow`
    (--allow-unknown-keys), one warning each instead."""
    referenced = {m.group(1) for v in raw.values() for m in _REF.finditer(v)}
    unknown = []
    for k in values:
        if k not in KEYS and k not in referenced:
            hint = difflib.get_close_matches(k.upper(), KEYS, n=1)
            unknown.append((k, lines.get(k, 0), f"did you mean {hint[0]}?" if hint else ""))
    if allow:
        return [f"{label} line {line}: unknown key '{k}' ignored" + (f" ({tip})" if tip else "")
                for k, line, tip in unknown]
    if len(unknown) == 1:
        [(k, line, tip)] = unknown
        raise config_error(f"{label} line {line}: unknown key '{k}'"
                           + (f" ({tip})" if tip else "") + ": correct or remove it, or pass "
                           "--allow-unknown-keys to ignore it")
    if unknown:
        named = [f"'{k}' (line {line}" + (f", {tip})" if tip else ")") for k, line, tip in unknown]
        raise config_error(f"{label}: unknown keys {', '.join(named[:-1])} and {named[-1]}: "
                           "correct or remove them, or pass --allow-unknown-keys to ignore them")
    return []


def _file_warnings(label: str, values: dict[str, str], raw: dict[str, str],
                   config: Config) -> list[str]:
    """${VAR} references that expanded differently from the final config.

    python-dotenv expands ${VAR} from keys earlier in the file, then from os.environ.
    """
    warnings = []
    defined: set[str] = set()
    for k, text in raw.items():
        for match in _REF.finditer(text):
            name, has_default = match.group(1), match.group(2) is not None
            if name not in defined and name not in os.environ and not has_default:
                warnings.append(f"{label}: {k} uses ${{{name}}}, which is set neither earlier "
                                f"in the file nor in the environment, so it expands to ''")
            elif k in KEYS and name in KEYS and (config.source[name] == "cli" or (
                    config.source[name] == "env" and name in defined)):
                warnings.append(
                    f"{label}: {k} uses ${{{name}}}, expanded when the file was read, so "
                    f"{name}={getattr(config, name.lower())} from the "
                    f"{_where(config.source[name], name)} does not change it ({k}="
                    f"{values[k]}); remove {k} from the file to get a default that follows "
                    f"overrides")
        defined.add(k)
    return warnings


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    allow_unknown_keys: bool = False,
) -> tuple[Config, list[str]]:
    """Resolve the configuration: overrides (flags) > environ > file > defaults.

    path=None reads ./config.env when it exists; a relative path is relative to the working
    directory. `overrides` uses UPPER_CASE keys; a None value means "flag not given". Only
    known keys are read from `environ` (default os.environ), which holds other variables
    too. An unknown key in the file is an error unless `allow_unknown_keys`.
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
            raise _missing_file(label)
        values, file_raw, warnings, lines = read_file(Path(path), label)
        if not file_raw:
            raise no_settings(Path(path), label)
        warnings += _unknown_keys(label, values, file_raw, lines, allow_unknown_keys)
        for k in KEYS:
            if k in values:
                raw_values[k], source[k] = values[k], f"file:{label}"
    for k in KEYS:
        if k in environ:
            raw_values[k], source[k] = environ[k], "env"
    for k, value in (overrides or {}).items():
        if k not in KEYS:
            raise config_error(f"command line: unknown key '{k}': expected one of "
                         f"{', '.join(KEYS)}")
        if value is not None:
            raw_values[k], source[k] = value, "cli"
    config = Config(**{KEYS[k].attr: v for k, v in raw_values.items()},  # type: ignore[arg-type]
                    source=source)
    _check_dataset(config)
    if label:
        warnings += _file_warnings(label, values, file_raw, config)
    return config, [escape_controls(w) for w in warnings]


def _check_dataset(config: Config) -> None:
    dataset = config.dataset
    if dataset in BUILTIN_DATASETS or Path(dataset).is_file():
        return
    hint = difflib.get_close_matches(dataset, BUILTIN_DATASETS, n=1)
    tip = f" (did you mean {hint[0]}?)" if hint else ""
    raise config_error(f"{_where(config.source['DATASET'], 'DATASET')}: DATASET='{dataset}' is not "
                 f"valid: expected {' or '.join(BUILTIN_DATASETS)}, or the path of an "
                 f"existing UTF-8 text file{tip}")


def check_data_dir(config: Config) -> None:
    """A DATA_DIR that was set must exist, for a command that reads the data (train, and
    warmup and banner with its options): the lookup refuses it too, but only this knows where
    it was set. (Chat and generate read no data, so a config's DATA_DIR from another machine
    does not stop them.)"""
    folder = config.data_dir
    if not folder or Path(folder).is_dir():
        return
    shown = folder if Path(folder).is_absolute() else f"{folder} ({Path(folder).absolute()})"
    raise config_error(f"DATA_DIR={shown} does not exist or is not a folder (set by "
                       f"{_where(config.source['DATA_DIR'], 'DATA_DIR')}): fix the path, or "
                       f"leave DATA_DIR empty to look in $RUSTYFLOW_DATA_DIR, ./data and "
                       f"../shared/data")


def _missing_file(label: str) -> ConfigError:
    """A config file that is not there, with the nearest names and the recipes on offer (the
    given folder's, ./configs/ and the checkout's configs/), so that `configs/quick` or a
    typo is one look away from the file meant."""
    path = Path(label)
    offered: dict[Path, str] = {}  # a recipe, resolved -> its name as the user would type it
    for folder in (path.parent, Path("configs"), _CHECKOUT / "configs"):
        if folder.is_dir():
            for recipe in sorted(folder.glob("*.env")):
                offered.setdefault(recipe.resolve(), str(recipe))
    names = list(offered.values())
    stems = difflib.get_close_matches(path.stem, [Path(n).stem for n in names], n=2)
    near: dict[str, str] = {}  # one name per stem: the given folder's, else ./configs/'s
    for name in names:
        if Path(name).stem in stems:
            near.setdefault(Path(name).stem, name)
    folders = dict.fromkeys(str(Path(n).parent) for n in names)
    listed = "; ".join(f"{folder}/ holds " + ", ".join(Path(n).name for n in names
                                                     if str(Path(n).parent) == folder)
                       for folder in folders)
    return config_error(f"{label}: config file not found (looked for {path.absolute()})"
                        + (f"; did you mean {' or '.join(near.values())}?" if near else "")
                        + (f" ({listed})" if listed else "")
                        + ": pass a file of KEY=VALUE lines")
