"""GPT-2 weights in and out of rustyflow in Hugging Face's format, checked against
transformers' own GPT2LMHeadModel: the same tokens give the same logits both ways."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rustyflow_py.engine.tensor import Tensor, no_grad
from rustyflow_py.model.generate import Decoder
from rustyflow_py.model.gpt import GPTConfig, build_model, init_weights
from rustyflow_py.training.config.config import Config
from rustyflow_py.training.evaluation.evaluate import load_model
from rustyflow_py.training.outputs import checkpoint

transformers = pytest.importorskip(
    "transformers", reason="the HF parity tests need transformers and CPU torch "
                           "(RUSTYFLOW_WITH_TORCH=1 ./test.sh installs them)")
torch = pytest.importorskip("torch", reason="transformers runs on torch")
pytest.importorskip("safetensors", reason="the hf extra: pip install 'rustyflow-py[hf]'")

from rustyflow_py.interop.hf_export import export_hf  # noqa: E402
from rustyflow_py.interop.hf_import import gpt2_shapes, import_hf  # noqa: E402

V, T, L, H, E = 101, 24, 2, 4, 32


def tiny_hf(folder, seed: int = 0, positions: int = T):
    """A random GPT2LMHeadModel, every parameter perturbed (so biases and LayerNorm are not
    their trivial zeros and ones), saved as safetensors in `folder`."""
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=positions, n_embd=E, n_layer=L,
                                  n_head=H)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()


def our_logits(path: str, tokens: np.ndarray, device: str = "cpu") -> np.ndarray:
    model, _, _ = load_model(path, device)
    with no_grad():
        out = model(Tensor(model.buffer.backend.from_host(tokens.astype(np.int32))))
    return np.asarray(model.buffer.backend.to_host(out.data), dtype=np.float32)


def assert_same_logits(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Within 1e-4 relative (to the logits' scale) in float32."""
    assert ours.shape == theirs.shape
    scale = float(np.abs(theirs).max())
    assert scale > 1.0  # perturbed weights: logits far from zero, so the check has teeth
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * scale)


def tokens(seed: int = 1, batch: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, size=(batch, T))


def test_shape_table_matches_the_model():
    """The tensors an import expects are exactly the ones rustyflow's GPT has."""
    ours = {k: v.shape for k, v in init_weights(GPTConfig(V, T, L, H, E), 0).items()}
    assert gpt2_shapes(V, T, L, E) == ours


def test_imported_logits_equal_transformers(tmp_path, device):
    """`device` (conftest): the CPU, and the GPU where one is usable (it skips otherwise)."""
    model = tiny_hf(tmp_path / "hf")
    out = str(tmp_path / "gpt2.npz")
    result = import_hf(str(tmp_path / "hf"), out, False, print)
    assert result["params"] == sum(p.numel() for p in model.transformer.parameters())
    x = tokens()
    assert_same_logits(our_logits(out, x, device), hf_logits(model, x))


def test_greedy_generation_equals_transformers(tmp_path, device):
    """50 greedy tokens through rustyflow's KV-cache decoding are transformers' generate's."""
    model = tiny_hf(tmp_path / "hf", positions=64)
    out = str(tmp_path / "gpt2.npz")
    import_hf(str(tmp_path / "hf"), out, False, print)
    prompt = [int(t) for t in tokens(seed=7, batch=1)[0, :8]]
    with torch.no_grad():
        theirs = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=50,
                                min_new_tokens=50, pad_token_id=0)[0, 8:].tolist()
    decoder = Decoder(load_model(out, device)[0])
    logits, ours = decoder.feed(prompt), []
    for _ in range(50):
        ours.append(int(np.argmax(logits)))
        logits = decoder.feed([ours[-1]])
    assert ours == theirs


def test_exported_model_loads_in_transformers(tmp_path):
    cfg = Config(seq_len=T, embed_dim=E, num_heads=H, num_layers=L)
    model = build_model(cfg, V, "cpu")
    rng = np.random.default_rng(3)
    weights = {k: v + rng.standard_normal(v.shape).astype(np.float32) * 0.2
               for k, v in model.buffer.state_dict().items()}
    vocab = np.array([f"w{i}" for i in range(V - 1)] + ["<eos>"])
    ckpt = str(tmp_path / "ours.npz")
    checkpoint.save(ckpt, weights, {"config": cfg.to_dict()}, vocab)
    export_hf(ckpt, str(tmp_path / "hf"), print)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert theirs.config.n_positions == T and theirs.config.eos_token_id == V - 1
    x = tokens(seed=5)
    assert_same_logits(our_logits(ckpt, x), hf_logits(theirs, x))
    # and back: the export imports to the same weights
    again = str(tmp_path / "again.npz")
    import_hf(str(tmp_path / "hf"), again, False, print)
    back = checkpoint.Checkpoint(again).weights
    assert all(np.array_equal(back[k], weights[k]) for k in weights)


def test_vocab_json_becomes_the_vocabulary(tmp_path):
    tiny_hf(tmp_path / "hf")
    words = [f"tok{i}" for i in range(V - 1)]  # one id left unused
    (tmp_path / "hf" / "vocab.json").write_text(json.dumps({w: i for i, w in enumerate(words)}))
    (tmp_path / "hf" / "merges.txt").write_text("#version: 0.2\n")
    out = tmp_path / "m.npz"
    import_hf(str(tmp_path / "hf"), str(out), False, print)
    ckpt = checkpoint.Checkpoint(out)
    assert list(ckpt.vocab) == words + [f"<unused-{V - 1}>"]
    assert ckpt.meta["imported"]["tokenizer"] == "gpt2"
