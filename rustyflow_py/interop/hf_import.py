"""`rustyflow import hf`: a GPT-2 in Hugging Face's format -> a rustyflow checkpoint.

The folder's config.json must describe a GPT-2 rustyflow's GPT computes (gpt2_config), and its
model.safetensors must hold exactly GPT-2's tensors. The layouts already agree: GPT-2's
attention and MLP weights are Conv1D modules, stored (in, out) and applied as x @ W, which is
how rustyflow stores its linear weights, so no tensor is transposed. The LM head is the token
embedding (tied); a file that stores a separate, different head is refused. pytorch_model.bin
is never read: it is a pickle, and unpickling runs code from the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InteropError, command
from ..training.outputs import checkpoint
from ..training.outputs.ownership import checkpoint_meta
from ..training.subword.tokenizer import load_gpt2
from . import safetensors_file
from .extra import require
from .gpt2_config import check_gpt2, run_config

WHAT = "rustyflow import hf"
FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer.json",
         "tokenizer_config.json")
# Buffers older GPT-2 files carry beside the weights: the causal mask (`attn.bias`) and the
# value masked positions get (`attn.masked_bias`). Both are constants rustyflow's attention
# applies itself.
BUFFER = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)\Z")
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?\Z")


def gpt2_shapes(vocab: int, positions: int, layers: int, width: int) -> dict[str, tuple]:
    """Every tensor of a GPT-2 by its rustyflow name (HF's without `transformer.`/`.weight`
    for the embeddings): what model.safetensors must hold."""
    e = width
    shapes: dict[str, tuple] = {"wte": (vocab, e), "wpe": (positions, e),
                                "ln_f.weight": (e,), "ln_f.bias": (e,)}
    for i in range(layers):
        for name, shape in (("ln_1.weight", (e,)), ("ln_1.bias", (e,)),
                            ("attn.c_attn.weight", (e, 3 * e)), ("attn.c_attn.bias", (3 * e,)),
                            ("attn.c_proj.weight", (e, e)), ("attn.c_proj.bias", (e,)),
                            ("ln_2.weight", (e,)), ("ln_2.bias", (e,)),
                            ("mlp.c_fc.weight", (e, 4 * e)), ("mlp.c_fc.bias", (4 * e,)),
                            ("mlp.c_proj.weight", (4 * e, e)), ("mlp.c_proj.bias", (e,))):
            shapes[f"h.{i}.{name}"] = shape
    return shapes


def rustyflow_name(hf_name: str) -> str:
    """transformer.wte.weight -> wte; transformer.h.0.ln_1.bias -> h.0.ln_1.bias."""
    name = hf_name.removeprefix("transformer.")
    return {"wte.weight": "wte", "wpe.weight": "wpe"}.get(name, name)


def locate(source: str, say: Callable[[str], None]) -> Path:
    """The local folder for `source`: the folder itself, or a Hub name's download."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists():
        raise InteropError(f"{source} is a file: pass the folder that holds config.json and "
                           f"model.safetensors")
    if not HUB_NAME.match(source):
        raise InteropError(f"{source} does not exist: pass a folder holding config.json and "
                           f"model.safetensors, or a Hugging Face Hub name such as gpt2")
    hub = require("huggingface_hub", f"{WHAT} {source} (a download from the Hub)")
    say(f"{source} is not a local folder: downloading it from the Hugging Face Hub")
    try:
        return Path(hub.snapshot_download(repo_id=source, allow_patterns=list(FILES)))
    except Exception as exc:  # noqa: BLE001 - network, auth, missing repo: all said below
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        raise InteropError(
            f"{source} is not a local folder, and downloading it from the Hugging Face Hub "
            f"failed ({reason}). Offline, fetch the folder where there is network (`hf "
            f"download {source} config.json model.safetensors vocab.json merges.txt "
            f"--local-dir {Path(source).name}`), copy it here and pass its path: `{command()} "
            f"import hf ./{Path(source).name}`") from None


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise InteropError(f"{folder} has no config.json: it is not a Hugging Face model "
                           f"folder (pass the folder save_pretrained wrote)")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise InteropError(f"{path} is not JSON: the folder is damaged") from None
    if not isinstance(hf, dict):
        raise InteropError(f"{path} is not a JSON object: the folder is damaged")
    check_gpt2(hf, path)
    return hf


def read_weights(folder: Path, hf: dict[str, Any]) -> dict[str, np.ndarray]:
    """model.safetensors' tensors under rustyflow's names, checked against the config."""
    path = folder / "model.safetensors"
    if not path.is_file():
        pickled = " (it has pytorch_model.bin, a pickle, which rustyflow never reads)" if (
            folder / "pytorch_model.bin").is_file() else ""
        sharded = " (sharded safetensors are not read: save it with a larger " \
                  "max_shard_size)" if (folder / "model.safetensors.index.json").is_file() else ""
        raise InteropError(f"{folder} has no model.safetensors{pickled}{sharded}: save the "
                           f"model with save_pretrained(DIR, safe_serialization=True)")
    tensors, _ = safetensors_file.read(path, WHAT)
    weights = {rustyflow_name(k): v for k, v in tensors.items() if not BUFFER.search(k)}
    head = weights.pop("lm_head.weight", None)
    expected = gpt2_shapes(hf["vocab_size"], hf.get("n_positions", hf.get("n_ctx")),
                           hf["n_layer"], hf["n_embd"])
    for name, shape in expected.items():
        if name not in weights:
            raise InteropError(f"{path} lacks the tensor {name} (shape {shape}) that a GPT-2 "
                               f"of this config.json has: the file is incomplete or belongs "
                               f"to another model")
        if weights[name].shape != shape:
            raise InteropError(f"{path}: tensor {name} has shape {weights[name].shape}, "
                               f"config.json's GPT-2 needs {shape}")
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise InteropError(f"{path} holds tensors a GPT2LMHeadModel does not have "
                           f"({', '.join(extra[:4])}): it is another architecture")
    if head is not None and not np.array_equal(head, weights["wte"]):
        raise InteropError(f"{path}: lm_head.weight differs from the token embedding "
                           f"(wte): rustyflow's LM head is tied to it, so an untied head "
                           f"cannot be expressed")
    return weights


def read_vocab(folder: Path, size: int) -> tuple[np.ndarray, str | None]:
    """The token strings by id (vocab.json, GPT-2's tokenizer vocabulary) and the tokenizer's
    name: gpt2 when merges.txt is there too, else None; without vocab.json, placeholders
    `<token-N>`. The checkpoint stores them as its vocabulary, so a run initialised from it can
    check it reads the same tokens."""
    path = folder / "vocab.json"
    if not path.is_file():
        return np.array([f"<token-{i}>" for i in range(size)]), None
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
        ids = {int(i): str(t) for t, i in table.items()}
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
        raise InteropError(f"{path} is not a JSON object of token -> id: the tokenizer "
                           f"files are damaged") from None
    if len(ids) != len(table) or any(not 0 <= i < size for i in ids):
        raise InteropError(f"{path} does not number its {len(table)} tokens 0..{size - 1} "
                           f"once each, as config.json's vocab_size={size} needs")
    tokenizer = "gpt2" if (folder / "merges.txt").is_file() else None
    return np.array([ids.get(i, f"<unused-{i}>") for i in range(size)]), tokenizer


def check_target(out: str, overwrite: bool) -> None:
    """--out may be written: new, or rustyflow's own checkpoint and --overwrite given."""
    target = Path(out)
    if not target.exists():
        return
    if not target.is_file() or checkpoint_meta(target) is None:
        raise InteropError(f"{out} exists and is not a rustyflow checkpoint: it is not "
                           f"overwritten; pass another --out")
    if not overwrite:
        raise InteropError(f"{out} holds a rustyflow checkpoint already: pass --overwrite to "
                           f"replace it, or another --out")


def import_hf(source: str, out: str, overwrite: bool,
              say: Callable[[str], None]) -> dict[str, Any]:
    """Read a GPT-2 folder (or Hub name) and write it as a rustyflow checkpoint at `out`."""
    if not out.endswith(".npz"):
        raise InteropError(f"--out {out}: a rustyflow checkpoint's path ends in .npz")
    check_target(out, overwrite)
    folder = locate(source, say)
    hf = read_config(folder)
    weights = read_weights(folder, hf)
    vocab, tokenizer = read_vocab(folder, hf["vocab_size"])
    cfg = run_config(hf, out)
    meta: dict[str, Any] = {
        "config": cfg.to_dict(),
        "imported": {"from": source, "format": "huggingface", "model_type": "gpt2",
                     "tokenizer": tokenizer}}
    subword = load_gpt2(folder) if tokenizer == "gpt2" else None
    if subword is not None and len(subword) == len(vocab):
        # GPT-2's own tokenizer goes with the weights, as a subword run's does: eval, generate
        # and chat then read text through it
        meta["tokenizer"] = subword.meta()
        vocab = subword.to_array()
        Path(out).parent.mkdir(parents=True, exist_ok=True)  # as checkpoint.save would
        subword.save_beside(out)
    checkpoint.save(out, weights, meta, vocab)
    vocab_from = ("vocab.json and merges.txt: GPT-2's tokenizer" if tokenizer else
                  "vocab.json (no merges.txt)" if (folder / "vocab.json").is_file() else
                  "none (no vocab.json: tokens are named <token-N>)")
    return {"path": out, "params": sum(w.size for w in weights.values()), "config": cfg,
            "vocabulary": vocab_from, "folder": str(folder)}
