"""`rustyflow export --format hf`: a rustyflow checkpoint -> a folder transformers loads.

The folder gets config.json and model.safetensors, as GPT2LMHeadModel.save_pretrained writes
them: `transformer.`-prefixed names, no lm_head (tied to wte), float32. Both files carry
rustyflow's mark (a `rustyflow` entry in config.json, `writer` in the safetensors metadata),
and a file in the folder without it is someone else's and is never written over.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..errors import CheckpointError, InteropError
from ..training.checkpoint import WRITER, Checkpoint
from ..training.config import Config, ConfigError
from ..training.outputs import write_atomically
from . import safetensors_file
from .gpt2_config import hf_config
from .hf_import import gpt2_shapes

WHAT = "rustyflow export --format hf"


def hf_name(name: str) -> str:
    """wte -> transformer.wte.weight; h.0.ln_1.bias -> transformer.h.0.ln_1.bias."""
    return "transformer." + {"wte": "wte.weight", "wpe": "wpe.weight"}.get(name, name)


def _ours_config(path: Path) -> bool:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    mark = data.get("rustyflow") if isinstance(data, dict) else None
    return isinstance(mark, dict) and mark.get("writer") == WRITER


def _ours_weights(path: Path) -> bool:
    meta = safetensors_file.metadata_of(path)
    return meta is not None and meta.get("writer") == WRITER


def check_folder(out: Path) -> None:
    """`out` may take the export: a new or existing folder whose config.json and
    model.safetensors, where they exist, are rustyflow's."""
    if out.exists() and not out.is_dir():
        raise InteropError(f"--out {out} is a file: pass a folder (it is created if missing)")
    for name, ours in (("config.json", _ours_config), ("model.safetensors", _ours_weights)):
        path = out / name
        if path.exists() and not (path.is_file() and ours(path)):
            raise InteropError(f"{path} exists and was not written by rustyflow: it is not "
                               f"overwritten; pass another --out folder")


def export_hf(model: str, out: str, say: Callable[[str], None]) -> dict[str, Any]:
    """Write checkpoint `model` into the folder `out` in Hugging Face's GPT-2 format."""
    folder = Path(out)
    check_folder(folder)
    ckpt = Checkpoint(model)
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
    tensors = {hf_name(n): np.asarray(ckpt.weights[n], dtype=np.float32) for n in shapes}
    origin = {"writer": WRITER, "version": __version__, "from": str(model)}
    folder.mkdir(parents=True, exist_ok=True)
    safetensors_file.write(folder / "model.safetensors", tensors,
                           {"format": "pt", "writer": WRITER}, WHAT)
    text = json.dumps(hf_config(cfg, vocab, origin), indent=2) + "\n"
    write_atomically(folder / "config.json", lambda f: f.write(text.encode()))
    say(f"wrote {folder / 'config.json'} and {folder / 'model.safetensors'}")
    return {"folder": str(folder), "params": sum(t.size for t in tensors.values())}
