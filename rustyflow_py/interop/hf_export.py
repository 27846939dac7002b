"""`rustyflow export --format hf`: a rustyflow checkpoint -> a folder transformers loads.

The folder gets config.json and model.safetensors, as GPT2LMHeadModel.save_pretrained writes
them: `transformer.`-prefixed names, no lm_head (tied to wte), float32; and the tokenizer files
AutoTokenizer reads (hf_tokenizer). config.json and model.safetensors carry rustyflow's mark
(a `rustyflow` entry in config.json, `writer` in the safetensors metadata); the tokenizer
files cannot carry one, so config.json's mark lists them with their sha256. A file in the
folder that is not rustyflow's by those marks is someone else's and is never written over.
config.json is written last: the mark goes on only once everything it vouches for is there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..data.checksums import sha256_of
from ..errors import CheckpointError, InteropError
from ..training.config.config import Config, ConfigError
from ..training.outputs.checkpoint import WRITER, Checkpoint
from ..training.outputs.writing import write_atomically
from . import safetensors_file
from .gpt2_config import hf_config
from .hf_import import gpt2_shapes
from .hf_tokenizer import NAMES, sha256s, tokenizer_files

WHAT = "rustyflow export --format hf"


def hf_name(name: str) -> str:
    """wte -> transformer.wte.weight; h.0.ln_1.bias -> transformer.h.0.ln_1.bias."""
    return "transformer." + {"wte": "wte.weight", "wpe": "wpe.weight"}.get(name, name)


def _mark(path: Path) -> dict[str, Any] | None:
    """config.json's rustyflow mark, or None when the file is not rustyflow's (or absent)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    mark = data.get("rustyflow") if isinstance(data, dict) else None
    return mark if isinstance(mark, dict) and mark.get("writer") == WRITER else None


def _ours_config(path: Path) -> bool:
    return _mark(path) is not None


def our_files(folder: Path) -> dict[str, str]:
    """The tokenizer files an earlier export wrote into `folder` (name -> sha256), from its
    config.json's mark."""
    files = (_mark(folder / "config.json") or {}).get("files")
    return {n: h for n, h in files.items() if n in NAMES} if isinstance(files, dict) else {}


def _sha256(path: Path) -> str | None:
    try:
        return sha256_of(path.read_bytes())
    except OSError:
        return None


def _ours_weights(path: Path) -> bool:
    meta = safetensors_file.metadata_of(path)
    return meta is not None and meta.get("writer") == WRITER


def check_folder(out: Path) -> None:
    """`out` may take the export: a new or existing folder whose config.json and
    model.safetensors, where they exist, are rustyflow's, and so is each tokenizer file
    there: listed in config.json's mark with its current sha256. Checked before the
    checkpoint is read, so a refused folder costs nothing."""
    if out.exists() and not out.is_dir():
        raise InteropError(f"--out {out} is a file: pass a folder (it is created if missing)")
    listed = our_files(out)
    for name in ("config.json", "model.safetensors", *NAMES):
        path = out / name
        if not path.exists():
            continue
        if name == "config.json":
            ours = path.is_file() and _ours_config(path)
        elif name == "model.safetensors":
            ours = path.is_file() and _ours_weights(path)
        else:
            digest = _sha256(path) if path.is_file() else None
            ours = digest is not None and digest == listed.get(name)
        if not ours:
            raise InteropError(f"{path} exists and was not written by rustyflow: it is not "
                               f"overwritten; pass another --out folder")


def export_hf(model: str, out: str, say: Callable[[str], None]) -> dict[str, Any]:
    """Write checkpoint `model` into the folder `out` in Hugging Face's GPT-2 format, with
    its tokenizer's files."""
    folder = Path(out)
    check_folder(folder)
    ckpt = Checkpoint(model, flag="`rustyflow export`")
    try:
        cfg = Config.from_dict(ckpt.config)
    except ConfigError as exc:
        raise CheckpointError(f"{model}: its stored configuration is invalid ({exc})") from None
    vocab = [str(t) for t in ckpt.vocab]
    shapes = gpt2_shapes(len(vocab), cfg.seq_len, cfg.num_layers, cfg.embed_dim)
    for name, shape in shapes.items():
        got = ckpt.weights.get(name)
        if got is None or got.shape != shape:
            what = "missing" if got is None else f"of shape {got.shape}"
            raise CheckpointError(f"{model}: tensor {name} is {what}, its config needs "
                                  f"{shape}: the checkpoint is damaged")
    files, what = tokenizer_files(ckpt, cfg.seq_len)
    tensors = {hf_name(n): np.asarray(ckpt.weights[n], dtype=np.float32) for n in shapes}
    origin = {"writer": WRITER, "version": __version__, "from": str(model),
              "files": sha256s(files)}
    stale = [folder / n for n in our_files(folder) if n not in files]
    folder.mkdir(parents=True, exist_ok=True)
    safetensors_file.write(folder / "model.safetensors", tensors,
                           {"format": "pt", "writer": WRITER}, WHAT)
    for name, data in files.items():
        write_atomically(folder / name, lambda f, data=data: f.write(data))
    for path in stale:  # an earlier export's tokenizer of another kind (checked ours above)
        path.unlink(missing_ok=True)
    text = json.dumps(hf_config(cfg, vocab, origin), indent=2) + "\n"
    write_atomically(folder / "config.json", lambda f: f.write(text.encode()))
    say(f"wrote {folder / 'config.json'}, {folder / 'model.safetensors'}"
        + (f" and {', '.join(files)}" if files else ""))
    say(what)
    return {"folder": str(folder), "params": sum(t.size for t in tensors.values()),
            "tokenizer": what, "files": ["config.json", "model.safetensors", *files]}
