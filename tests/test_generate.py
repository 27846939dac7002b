"""Generation: the KV cache against the uncached model, text, chat, CLI, scripts."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rustyflow_py.cli import main
from rustyflow_py.data import EOS, UNK, Vocab
from rustyflow_py.engine.tensor import Tensor, no_grad
from rustyflow_py.model.generate import (
    Decoder,
    Sampling,
    Session,
    chat_loop,
    encode_prompt,
    generate_text,
    render,
)
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.training.config.config import Config
from rustyflow_py.training.evaluation.evaluate import load_model
from rustyflow_py.training.outputs import checkpoint
from rustyflow_py.training.outputs.checkpoint import CheckpointError

REPO = Path(__file__).resolve().parents[1]
WORDS = [UNK, EOS, *(f"w{i}" for i in range(28))]
SEQ_LEN, LAYERS, HEADS, EMBED = 8, 2, 2, 16
GREEDY = Sampling(temperature=0.0)


def tiny_model(device: str = "cpu", vocab: int = len(WORDS), seed: int = 0) -> GPT:
    """A random tiny GPT, its embeddings scaled up so the logits are far from uniform."""
    model = GPT(GPTConfig(vocab, SEQ_LEN, LAYERS, HEADS, EMBED), device, seed)
    model.p["wte"].data[...] *= 50
    model.training = False
    return model


def save_checkpoint(path: Path, model: GPT, words: list[str] = WORDS, device: str = "cpu",
                    **config: object) -> Path:
    """A checkpoint laid out like Trainer.save's (config, device, train state, vocabulary)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dataset = path.parent / "corpus.txt"
    dataset.write_text(" ".join(words) + "\n")
    shape = {"seq_len": SEQ_LEN, "embed_dim": EMBED, "num_heads": HEADS, "num_layers": LAYERS}
    cfg = Config(dataset=str(dataset), **{**shape, **config})  # type: ignore[arg-type]
    meta = {"config": cfg.to_dict(), "device": device,
            "train": {"step": 1, "epoch": 0, "batch": 1, "losses": [3.0], "epoch_times": [],
                      "val_ppl": None}}
    return checkpoint.save(path, model.buffer.state_dict(), meta, Vocab(words).to_array())


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    return save_checkpoint(tmp_path / "models" / "tiny-cpu.npz", tiny_model())


@pytest.fixture()
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No ./config.env and no sampling keys from the environment."""
    monkeypatch.chdir(tmp_path)
    for key in ("TEMPERATURE", "TOP_K", "TOP_P", "SEED", "DEVICE"):
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def words_of(session: Session, prompt: str, n: int = 20) -> list[str]:
    ids, _ = encode_prompt(prompt, session.vocab)
    return list(session.generate(ids, n))


# ---------------------------------------------------------------------------- KV cache


def uncached_logits(model: GPT, context: list[int]) -> np.ndarray:
    """The last position's logits of the plain model on the last SEQ_LEN tokens."""
    window = np.asarray([context[-SEQ_LEN:]], np.int32)  # (1, T)
    with no_grad():
        logits = model(Tensor(window, device=model.device))  # (1, T, V)
    return model.buffer.backend.to_host(logits.data)[0, -1]


def test_kv_cache_matches_uncached_model_past_seq_len(device: str) -> None:
    model = tiny_model(device)
    decoder = Decoder(model)
    rng = np.random.default_rng(0)
    # a prompt, single tokens across the SEQ_LEN boundary, a chunk into a non-empty cache
    # (chat), then a chunk that overflows the window
    feeds = [[3, 4, 5], *([int(t)] for t in rng.integers(0, len(WORDS), 9)), [6, 7],
             [8, 9, 10, 11, 12], *([int(t)] for t in rng.integers(0, len(WORDS), 4))]
    context: list[int] = []
    for ids in feeds:
        context += ids
        cached = decoder.feed(ids)
        assert decoder.context == context[-SEQ_LEN:]
        np.testing.assert_allclose(cached, uncached_logits(model, context), rtol=1e-4,
                                   atol=1e-4)
    assert len(context) > 2 * SEQ_LEN


def test_cached_forward_in_chunks_matches_uncached_batch(device: str) -> None:
    """The model's forward with a cache: a prefill, one token, then a chunk (offset causal
    mask), for two sequences at once, gives each chunk's last logits of the full forward."""
    model = tiny_model(device)
    tokens = np.random.default_rng(3).integers(0, len(WORDS), (2, SEQ_LEN)).astype(np.int32)
    with no_grad():
        full = model.buffer.backend.to_host(model(Tensor(tokens, device=device)).data)
        cache = model.new_cache(batch=2)
        for start, stop in [(0, 3), (3, 4), (4, SEQ_LEN)]:
            chunk = Tensor(tokens[:, start:stop], device=device)
            logits = model(chunk, cache=cache)  # (2, 1, V)
            assert cache.length == stop
            np.testing.assert_allclose(model.buffer.backend.to_host(logits.data)[:, 0],
                                       full[:, stop - 1], rtol=1e-4, atol=1e-4)


def test_cached_forward_rejects_targets_overflow_and_backward() -> None:
    model = tiny_model()
    cache = model.new_cache()
    ids = Tensor(np.zeros((1, 3), np.int32))
    with pytest.raises(ValueError, match="without targets"):
        model(ids, ids, cache=cache)
    cache.length = SEQ_LEN - 2
    with pytest.raises(ValueError, match="longer than SEQ_LEN"):
        model(ids, cache=cache)
    cache.length = 0
    with pytest.raises(NotImplementedError, match="inference-only"):
        model(ids, cache=cache).sum().backward()


# ---------------------------------------------------------------------------- sessions


def test_greedy_is_deterministic(device: str) -> None:
    a = words_of(Session(tiny_model(device), Vocab(WORDS), GREEDY, seed=1), "w1 w2")
    b = words_of(Session(tiny_model(device), Vocab(WORDS), GREEDY, seed=2), "w1 w2")
    assert a == b and len(a) == 20


@pytest.mark.parametrize("sampling", [Sampling(1.0, top_k=1), Sampling(1.0, top_p=1e-9),
                                      Sampling(0.0, top_k=5, top_p=0.5)],
                         ids=["top-k=1", "top-p=1e-9", "temperature=0"])
def test_degenerate_sampling_equals_greedy(sampling: Sampling) -> None:
    greedy = words_of(Session(tiny_model(), Vocab(WORDS), GREEDY, seed=0), "w3")
    assert words_of(Session(tiny_model(), Vocab(WORDS), sampling, seed=7), "w3") == greedy


def test_seeds() -> None:
    words = [f"v{i}" for i in range(500)]
    model = tiny_model(vocab=len(words))
    model.p["wte"].data[...] /= 50  # near-uniform logits over a large vocabulary

    def run(seed: int) -> list[str]:
        return words_of(Session(model, Vocab(words), Sampling(1.0), seed), "v1 v2")

    assert run(5) == run(5)
    assert run(5) != run(6)


# ---------------------------------------------------------------------------- text


def test_prompt_gets_eos_only_when_it_ends_a_line() -> None:
    vocab = Vocab(WORDS)
    w1, w2, eos = vocab.stoi["w1"], vocab.stoi["w2"], vocab.eos_id
    assert encode_prompt("w1 w2", vocab) == ([w1, w2], [])
    assert encode_prompt("w1 w2\n", vocab) == ([w1, w2, eos], [])
    assert encode_prompt("w1\nw2", vocab) == ([w1, eos, w2], [])
    assert encode_prompt("", vocab) == ([], [])


def test_unknown_words_become_unk_or_are_dropped() -> None:
    vocab = Vocab(WORDS)
    assert encode_prompt("w1 zebra w2", vocab) == (
        [vocab.stoi["w1"], vocab.unk_id, vocab.stoi["w2"]], ["zebra"])
    no_unk = Vocab(WORDS[1:])
    assert encode_prompt("w1 zebra", no_unk) == ([no_unk.stoi["w1"]], ["zebra"])


def test_eos_renders_as_newline() -> None:
    assert render(["w1", "w2", EOS, "w3", EOS, EOS]) == "w1 w2\nw3\n\n"


def eos_model() -> GPT:
    """A model whose next token is always <eos>: the final LayerNorm outputs wte[<eos>]."""
    model = tiny_model()
    model.p["ln_f.weight"].data[...] = 0
    model.p["ln_f.bias"].data[...] = model.p["wte"].data[WORDS.index(EOS)]
    return model


def test_generate_text_echoes_prompt_and_notes_unknown_words() -> None:
    out, err = io.StringIO(), io.StringIO()
    generate_text(Session(eos_model(), Vocab(WORDS), GREEDY, 0), "w1 zebra ", 3, out, err)
    assert out.getvalue() == "w1 zebra\n\n\n"
    assert "zebra" in err.getvalue() and UNK in err.getvalue()


# ---------------------------------------------------------------------------- checkpoints


def test_corrupt_checkpoint_is_a_checkpoint_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a checkpoint" * 8)
    with pytest.raises(CheckpointError, match="not a readable RustyFlow checkpoint"):
        load_model(str(bad), "cpu")


def test_truncated_checkpoint_is_a_checkpoint_error(ckpt: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.npz"
    cut.write_bytes(ckpt.read_bytes()[:1000])
    with pytest.raises(CheckpointError):
        load_model(str(cut), "cpu")


def test_weights_that_do_not_fit_the_config(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "m.npz", tiny_model(), embed_dim=32)
    with pytest.raises(CheckpointError, match="does not match its own config"):
        load_model(str(path), "cpu")


def test_cli_errors_are_one_line(ckpt: Path, isolated: Path) -> None:
    bad = isolated / "bad.npz"
    bad.write_bytes(b"garbage" * 20)
    mismatched = save_checkpoint(isolated / "m.npz", tiny_model(), embed_dim=32)
    runner = CliRunner()
    for path in (bad, mismatched, isolated / "missing.npz"):
        result = runner.invoke(main, ["generate", "--model", str(path), "--prompt", "w1"])
        assert result.exit_code == 1 and "Error:" in result.output
        assert "Traceback" not in result.output
    result = runner.invoke(main, ["generate", "--model", str(ckpt), "--prompt", "w1",
                                  "--top-p", "0"])
    assert result.exit_code == 1 and "TOP_P='0'" in result.output


def test_gpu_trained_checkpoint_generates_on_cpu(tmp_path: Path, isolated: Path) -> None:
    model = tiny_model()
    path = save_checkpoint(tmp_path / "tiny-gpu.npz", model, device="gpu")
    result = CliRunner().invoke(main, ["generate", "--model", str(path), "--prompt", "w1 w2",
                                       "--device", "cpu", "--temperature", "0",
                                       "--max-tokens", "10", "--quiet"])
    assert result.exit_code == 0, result.output
    expected = words_of(Session(model, Vocab(WORDS), GREEDY, 0), "w1 w2", 10)
    assert result.stdout == render(["w1", "w2", *expected]) + ("" if expected[-1] == EOS
                                                                else "\n")


# ---------------------------------------------------------------------------- chat


def test_chat_loop_two_prompts_skips_blank_lines_and_quits() -> None:
    session = Session(tiny_model(), Vocab(WORDS), GREEDY, 0)
    out = io.StringIO()
    chat_loop(session, io.StringIO("w1 w2\n\n   \nw3\nquit\nw4\n"), out, io.StringIO(), 3)
    text = out.getvalue()
    # prompts: w1 w2, two blank lines (no reply), w3, quit
    assert re.fullmatch(r"> \S+( \S+){0,2}\n> > > \S+( \S+){0,2}\n> ", text), text
    vocab = session.vocab
    assert vocab.stoi["w3"] in session.decoder.context
    assert vocab.stoi["w4"] not in session.decoder.context
    assert session.generated > 0


def test_chat_loop_ends_at_eof() -> None:
    session = Session(eos_model(), Vocab(WORDS), GREEDY, 0)
    out = io.StringIO()
    chat_loop(session, io.StringIO("w1 zebra"), out, err := io.StringIO(), 5)
    assert out.getvalue() == "> \n> \n"  # the reply is an empty line: <eos> at once
    assert session.generated == 1 and "zebra" in err.getvalue()


def test_chat_turns_carry_the_cache_and_reply_as_a_fresh_prefill_would(device: str) -> None:
    """A second turn prefills only its own words into the KV cache the first left (no
    re-prefill of the history); its reply is the one a fresh session gives after the whole
    history prefilled at once (GPU: the replayed graph and the queued steps)."""
    model = GPT(GPTConfig(len(WORDS), 64, LAYERS, HEADS, EMBED), device, 0)
    model.p["wte"].data[...] *= 50
    model.training = False
    chat = Session(model, Vocab(WORDS), GREEDY, 0)
    chat_loop(chat, io.StringIO("w1 w2 w3\n"), io.StringIO(), io.StringIO(), 6)
    before = len(chat.decoder.context)
    chat_loop(chat, io.StringIO("w4 w5\n"), io.StringIO(), io.StringIO(), 6)
    assert chat.timing.prefilled in (2, 3)  # w4 w5, after an <eos> if the reply was cut
    history = chat.decoder.context[: before + chat.timing.prefilled]
    reply = chat.decoder.context[before + chat.timing.prefilled :]
    fresh = Session(model, Vocab(WORDS), GREEDY, 0)
    again = [int(ids[0]) for ids in fresh.tokens(history, len(reply))]
    assert reply and again == reply
    assert chat.decoder.cache.length == len(chat.decoder.context)


def test_cli_generate_keeps_the_start_up_out_of_the_rate_and_quiet_keeps_stderr_empty(
        ckpt: Path, isolated: Path) -> None:
    """The prompt's prefill and the first token are the start-up line; the rate is of the
    tokens after them. --quiet: nothing on stderr, not even the note on unknown words."""
    runner = CliRunner()
    base = ["generate", "--model", str(ckpt), "--prompt", "w1 zebra w2", "--max-tokens", "12",
            "--temperature", "0", "--device", "cpu"]
    loud, quiet = runner.invoke(main, base), runner.invoke(main, [*base, "--quiet"])
    assert loud.exit_code == 0 and quiet.exit_code == 0, loud.output
    note, start_up, rate = loud.stderr.splitlines()
    assert "zebra" in note
    assert re.fullmatch(r"Start-up: prefill of 3 prompt tokens \d+\.\d{3}s, first token "
                        r"\d+\.\d{3}s; kept out of the tokens/s", start_up), start_up
    assert re.fullmatch(r"Decoding: 11 tokens in \d+\.\d{3}s \([\d,]+\.\d tokens/s, cpu, "
                        r"batch 1\)", rate), rate
    assert quiet.stderr == "" and quiet.stdout == loud.stdout


def test_cli_generate_and_chat(ckpt: Path, isolated: Path) -> None:
    runner = CliRunner()
    (isolated / "greedy.env").write_text("TEMPERATURE=0\nSEED=3\n")
    base = ["generate", "--model", str(ckpt), "--prompt", "w1 w2", "--max-tokens", "12"]
    flag = runner.invoke(main, [*base, "--temperature", "0"])
    from_config = runner.invoke(main, [*base, "--config", "greedy.env", "--quiet"])
    assert flag.exit_code == 0 and from_config.exit_code == 0, flag.output
    assert flag.stdout == from_config.stdout and flag.stdout.startswith("w1 w2")
    assert "tokens/s" in flag.stderr and "tokens/s" not in from_config.stderr

    chat = runner.invoke(main, ["chat", "--model", str(ckpt), "--device", "cpu",
                                "--max-tokens", "4"], input="w5\n\nexit\n")
    assert chat.exit_code == 0, chat.output
    assert chat.stdout.count("> ") == 3 and "tokens/s" in chat.stderr


def test_generate_and_chat_take_threads_from_the_flag_or_the_config(
        ckpt: Path, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """THREADS (batch-1 decoding on a many-core CPU is faster on a few): --threads, else the
    config's; the same greedy text on any count."""
    from rustyflow_py.training.evaluation import evaluate

    seen: list[int] = []
    real = evaluate.load_model

    def spy(path: str, device: str, threads: int = 0) -> object:
        seen.append(threads)
        return real(path, device, threads)

    monkeypatch.setattr(evaluate, "load_model", spy)
    monkeypatch.delenv("THREADS", raising=False)
    (isolated / "two.env").write_text("THREADS=2\n")
    base = ["generate", "--model", str(ckpt), "--prompt", "w1", "--max-tokens", "8",
            "--temperature", "0", "--device", "cpu", "--quiet"]
    runs = [CliRunner().invoke(main, [*base, *extra])
            for extra in ([], ["--threads", "3"], ["--config", "two.env"])]
    assert all(r.exit_code == 0 for r in runs), [r.output for r in runs]
    assert seen == [0, 3, 2]
    assert runs[0].stdout == runs[1].stdout == runs[2].stdout


def test_cli_generate_num_samples(ckpt: Path, isolated: Path) -> None:
    """N samples at once, each under its header; the first is the single sample's text."""
    runner = CliRunner()
    base = ["generate", "--model", str(ckpt), "--prompt", "w1 w2", "--max-tokens", "12",
            "--temperature", "1.0", "--seed", "4", "--quiet"]
    single = runner.invoke(main, base)
    many = runner.invoke(main, [*base, "--num-samples", "3"])
    assert single.exit_code == 0 and many.exit_code == 0, many.output
    parts = re.split(r"^=== sample (\d) of 3 ===\n", many.stdout, flags=re.M)
    assert parts[0] == "" and parts[1::2] == ["1", "2", "3"]
    assert parts[2] == single.stdout + "\n"  # a blank line before the next header
    assert all(p.startswith("w1 w2") for p in parts[2::2])
    bad = runner.invoke(main, [*base, "--num-samples", "0"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


# ---------------------------------------------------------------------------- scripts


def run_script(name: str, config: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run([str(REPO / name), str(config)], input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_chat_script_lists_models_when_missing(device: str, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "other-cpu.npz").write_bytes(b"")
    config = tmp_path / "chat.env"
    config.write_text(f"MODEL_PATH={models}/tiny.npz\n")
    result = run_script(f"chat_{device}.sh", config)
    assert result.returncode == 1 and result.stderr.startswith("Error: no ")  # one prefix
    assert f"tiny-{device}.npz" in result.stderr and "other-cpu.npz" in result.stderr


def test_chat_script_chats_without_a_tty(ckpt: Path, tmp_path: Path) -> None:
    config = tmp_path / "chat.env"
    config.write_text(f"MODEL_PATH={ckpt.parent}/tiny.npz\nTEMPERATURE=0\n")
    result = run_script("chat_cpu.sh", config, stdin="w1 w2\nquit\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("> ") == 2 and "tokens/s" in result.stderr
