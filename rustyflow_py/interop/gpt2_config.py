"""GPT-2's config.json <-> rustyflow's run configuration: what maps, and what is refused.

rustyflow's GPT fixes some of what GPT-2's config leaves open: the tanh GELU, LayerNorm
epsilon 1e-5, attention scaled by 1/sqrt(head size), an MLP four times the width, the LM head
tied to the token embedding. A config that asks for anything else is refused, naming the
field, rather than imported into a model that would compute something else.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import InteropError
from ..model.gpt import LN_EPS
from ..training.config.config import Config

# the tanh approximation of GELU, which rustyflow's GELU computes (transformers' names)
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# field -> the value rustyflow's model computes (a missing field takes GPT2Config's default,
# which is this value too)
FIXED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
         "add_cross_attention": False, "tie_word_embeddings": True}
SHAPE = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")


def _refuse(path: Path, field: str, value: Any, why: str) -> InteropError:
    return InteropError(f"{path}: {field}={value!r} cannot be expressed by rustyflow's GPT "
                        f"({why}); only GPT-2 models with rustyflow's fixed choices import")


def check_gpt2(hf: dict[str, Any], path: Path) -> None:
    """InteropError unless config.json describes a GPT-2 that rustyflow's GPT computes."""
    kind = hf.get("model_type")
    if kind != "gpt2":
        raise InteropError(f"{path}: model_type is {kind!r}, not 'gpt2': rustyflow imports "
                           f"GPT-2 models only (GPT2LMHeadModel in transformers)")
    for field in SHAPE:
        value = hf.get(field, hf.get("n_ctx") if field == "n_positions" else None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InteropError(f"{path}: {field}={value!r} is not a positive integer: the "
                               f"config is damaged")
    if hf["n_embd"] % hf["n_head"]:
        raise _refuse(path, "n_embd", hf["n_embd"], f"not divisible by n_head={hf['n_head']}")
    act = hf.get("activation_function", "gelu_new")
    if act not in TANH_GELU:
        raise _refuse(path, "activation_function", act, "its GELU is the tanh approximation, "
                      "gelu_new")
    eps = hf.get("layer_norm_epsilon", LN_EPS)
    if not isinstance(eps, (int, float)) or not math.isclose(eps, LN_EPS, rel_tol=1e-6):
        raise _refuse(path, "layer_norm_epsilon", eps, f"its LayerNorm epsilon is {LN_EPS:g}")
    inner = hf.get("n_inner")
    if inner is not None and inner != 4 * hf["n_embd"]:
        raise _refuse(path, "n_inner", inner, f"its MLP is 4 x n_embd = {4 * hf['n_embd']} wide")
    for field, value in FIXED.items():
        if hf.get(field, value) != value:
            raise _refuse(path, field, hf[field], f"it needs {field}={value}")


def run_config(hf: dict[str, Any], model_path: str) -> Config:
    """The run configuration an imported GPT-2 is stored with: its shape (SEQ_LEN is the
    position count, n_positions) and its dropout rates (absent: GPT2Config's default, 0.1);
    everything else stays the default."""
    return Config(
        seq_len=hf.get("n_positions", hf.get("n_ctx")), embed_dim=hf["n_embd"],
        num_heads=hf["n_head"], num_layers=hf["n_layer"],
        embd_dropout=hf.get("embd_pdrop", 0.1), attn_dropout=hf.get("attn_pdrop", 0.1),
        resid_dropout=hf.get("resid_pdrop", 0.1), model_path=model_path,
        source=dict.fromkeys(("SEQ_LEN", "EMBED_DIM", "NUM_HEADS", "NUM_LAYERS"), "config.json"))


def hf_config(cfg: Config, vocab: list[str], origin: dict[str, Any]) -> dict[str, Any]:
    """config.json for a rustyflow model: GPT2LMHeadModel with its shape; n_positions is
    SEQ_LEN, the rows of its position table. `origin` (what wrote it, from which checkpoint)
    is kept under a key of its own: it is the file's mark that rustyflow made it."""
    rate = lambda own: cfg.dropout if own < 0 else own  # noqa: E731 (as GPTConfig.rate)
    end = next((vocab.index(t) for t in ("<|endoftext|>", "<eos>") if t in vocab), None)
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": len(vocab), "n_positions": cfg.seq_len, "n_embd": cfg.embed_dim,
        "n_layer": cfg.num_layers, "n_head": cfg.num_heads, "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": LN_EPS,
        "embd_pdrop": rate(cfg.embd_dropout), "attn_pdrop": rate(cfg.attn_dropout),
        "resid_pdrop": rate(cfg.resid_dropout),
        "initializer_range": 0.02, "bos_token_id": end, "eos_token_id": end,
        **FIXED, "reorder_and_upcast_attn": False, "use_cache": True, "torch_dtype": "float32",
        "rustyflow": origin,
    }
