"""Inputs that cannot train stop before training, with one `Error:` line naming the key or
file and the fix: a training text with fewer than two distinct words, a config file that sets
a key twice, a split with fewer windows than a batch (the train split at a step's
BATCH_SIZE x GRAD_ACCUM_STEPS streams, validation at BATCH_SIZE), and a derived value (a head
size, the attention dropout) named by the keys that make it.

Each command runs in the fault matrix's starting folder (a trained tiny model, its log, a text
file and another program's .npz): a refused run leaves every one of those files as it was,
and never builds a model.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    TINY,
    TINY_TEXT,
    TRAIN,
    TRAINED,
    assert_intact,
    env_file,
    invoke,
    make_cfg,
    snapshot,
)

from rustyflow_py import data
from rustyflow_py.errors import ConfigError, DataError
from rustyflow_py.training.run import parts as run_parts

NEW = ("--model-path", "models/new.npz")  # a path no earlier run used
ONE_WORD = "a a a a a a a a\n" * 300  # the tiny text's length, one word


def write(name: str, text: str) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        (root / name).write_text(text)
    return setup


def with_lines(*lines: str) -> Callable[[Path], None]:
    """tiny.env with `lines` after its own (a blank line and a comment before them)."""
    return write("tiny.env", env_file(TINY) + "\n# changed later\n" + "".join(lines))


CASES = {
    "one-word-text": (write("one.txt", ONE_WORD), (*TRAIN, *NEW, "--dataset", "one.txt"),
                      "Error: one.txt: the training text (its first 90%) has 1 distinct word "
                      "('a') besides line ends: there is nothing to learn; set DATASET to a "
                      "text of at least 2 distinct words"),
    "only-blank-lines": (write("blank.txt", "\n" * 2100),
                         (*TRAIN, *NEW, "--dataset", "blank.txt"),
                         "Error: blank.txt: the training text (its first 90%) has no word at "
                         "all, only line ends: there is nothing to learn; set DATASET to a text "
                         "of at least 2 distinct words"),
    "one-word-subwords": (write("one.txt", ONE_WORD),
                          (*TRAIN, *NEW, "--dataset", "one.txt", "--tokenizer", "bpe",
                           "--bpe-vocab", "300"),
                          "Error: one.txt: the training text (its first 90%) has 1 distinct "
                          "word ('a') besides line ends: there is nothing to learn; set DATASET "
                          "to a text of at least 2 distinct words"),
    "key-set-twice": (with_lines("BATCH_SIZE=8\n"), TRAIN,
                      "Error: tiny.env sets BATCH_SIZE twice (line 3: 4, line 16: 8): keep one"),
    "key-set-three-times": (with_lines("SEQ_LEN=32\n", "export SEQ_LEN=\n"), TRAIN,
                            "Error: tiny.env sets SEQ_LEN 3 times (line 2: 16, line 16: 32, "
                            "line 17: empty): keep one"),
    "accumulated-step-too-big": (None, (*TRAIN, *NEW, "--grad-accum-steps", "64"),
                                 "Error: tiny: the train split has 1890 tokens, too few for "
                                 "BATCH_SIZE=4 x GRAD_ACCUM_STEPS=64 = 256 streams of "
                                 "SEQ_LEN+1=17 tokens (at least 4352 tokens); use BATCH_SIZE=1 "
                                 "or less (at SEQ_LEN=16), or SEQ_LEN=6 or less (at "
                                 "BATCH_SIZE=4), or GRAD_ACCUM_STEPS=27 or less, or more text"),
    "valid-split-too-short": (None, (*TRAIN, *NEW, "--batch-size", "13"),
                              "Error: tiny: the valid split has 210 tokens, too few for "
                              "BATCH_SIZE=13 streams of SEQ_LEN+1=17 tokens (at least 221 "
                              "tokens); use BATCH_SIZE=12 or less (at SEQ_LEN=16), or SEQ_LEN=15 "
                              "or less (at BATCH_SIZE=13), or more text"),
    "both-splits-too-short": (None, (*TRAIN, *NEW, "--batch-size", "14", "--seq-len", "20",
                                     "--grad-accum-steps", "8"),
                              "Error: tiny: the train split has 1890 tokens, too few for "
                              "BATCH_SIZE=14 x GRAD_ACCUM_STEPS=8 = 112 streams of SEQ_LEN+1=21 "
                              "tokens (at least 2352 tokens), and the valid split has 210 tokens, "
                              "too few for BATCH_SIZE=14 streams of SEQ_LEN+1=21 tokens (at least "
                              "294 tokens); use BATCH_SIZE=10 or less (at SEQ_LEN=20), or "
                              "SEQ_LEN=14 or less (at BATCH_SIZE=14), or more text"),
    "offsets-past-an-accumulated-step": (
        None, (*TRAIN, *NEW, "--seq-len", "40", "--grad-accum-steps", "12", "--random-offsets"),
        "Error: tiny: RANDOM_OFFSETS=true needs at least 2*SEQ_LEN=80 training tokens per "
        "stream (a window after an offset of up to SEQ_LEN-1), but BATCH_SIZE=4 x "
        "GRAD_ACCUM_STEPS=12 = 48 streams have 39 each; use RANDOM_OFFSETS=false, BATCH_SIZE=1 "
        "or less, GRAD_ACCUM_STEPS=5 or less, or SEQ_LEN=19 or less"),
}


def never_built(monkeypatch: pytest.MonkeyPatch) -> None:
    def build(*_: object, **__: object) -> None:
        raise AssertionError("a model was built for inputs that cannot train")
    monkeypatch.setattr(run_parts, "build_model", build)


@pytest.mark.parametrize("name", CASES)
def test_an_input_that_cannot_train_stops_before_training(
        name: str, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup, args, message = CASES[name]
    monkeypatch.setenv("RUSTYFLOW_CACHE_DIR", str(workspace / "cache"))
    if setup:
        setup(workspace)
    before = snapshot(workspace)
    never_built(monkeypatch)
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    assert [line for line in result.output.splitlines() if "Error" in line] == [message]
    assert_intact(before, snapshot(workspace))


def test_the_trained_run_on_one_word_loses_nothing(workspace: Path) -> None:
    """The same checkpoint path, told to overwrite: the refusal still comes before any write,
    so the earlier run's checkpoint, best checkpoint and log are as they were."""
    (workspace / "one.txt").write_text(ONE_WORD)
    before = snapshot(workspace)
    result = invoke(*TRAIN, "--dataset", "one.txt", "--model-path", "models/tiny.npz",
                    "--overwrite")
    assert result.exit_code == 1, result.output
    assert "has 1 distinct word ('a')" in result.output.splitlines()[-1]
    assert all((workspace / path).is_file() for path in TRAINED)
    assert_intact(before, snapshot(workspace))


def test_two_distinct_words_train(tiny_dir: Path) -> None:
    """The rule's edge: a text of two words (and line ends) is enough to train on."""
    (tiny_dir / "two.txt").write_text("a b a a b\n" * 400)
    result = invoke(*TRAIN, "--dataset", "two.txt", "--max-steps", "2")
    assert result.exit_code == 0, result.output


def test_a_key_set_once_with_a_reference_to_itself_elsewhere_is_no_duplicate(
        tiny_dir: Path) -> None:
    """Only assignments count: ${BATCH_SIZE} in another key's value sets nothing."""
    (tiny_dir / "tiny.env").write_text(env_file(TINY) + "EVAL_TOKENS=${BATCH_SIZE}00\n")
    result = invoke(*TRAIN, "--max-steps", "2")
    assert result.exit_code == 0, result.output


def test_the_layout_advice_with_accumulation_fits() -> None:
    """Every BATCH_SIZE, SEQ_LEN or GRAD_ACCUM_STEPS the message offers makes the layout fit,
    and a layout that fits is never refused, for training and validation splits alike."""
    vocab = data.Vocab.build(["a"])
    for n, valid, batch, seq, accum, procs in itertools.product(
            (20, 60, 200), (9, 40), range(1, 5), (1, 3, 8), (1, 2, 5), (1, 2)):
        corpus = data.Corpus("x", vocab, np.zeros(n, np.int32), np.zeros(valid, np.int32),
                             np.zeros(valid, np.int32), "x", test_is_valid=True)
        fits = (n // (batch * accum * procs) >= seq + 1) and valid // batch >= seq + 1
        check = functools.partial(data.check_layout, corpus, processes=procs)
        try:
            check(batch, seq, accum=accum)
        except DataError as err:
            assert not fits, (n, valid, batch, seq, accum, procs)
            text = str(err)
            for b in re.findall(r"BATCH_SIZE=(\d+) or less", text):
                check(int(b), seq, accum=accum)
            for s in re.findall(r"SEQ_LEN=(\d+) or less \(at BATCH_SIZE", text):
                check(batch, int(s), accum=accum)
            for s in re.findall(r"BATCH_SIZE=1 with SEQ_LEN=(\d+) or less", text):
                check(1, int(s), accum=accum)
            for a in re.findall(r"GRAD_ACCUM_STEPS=(\d+) or less", text):
                check(batch, seq, accum=int(a))
        else:
            assert fits, (n, valid, batch, seq, accum, procs)


def test_a_short_test_split_is_named_at_the_evaluation_batch() -> None:
    """Validation and test are read as BATCH_SIZE streams, whatever GRAD_ACCUM_STEPS is."""
    vocab = data.Vocab.build(["a"])
    long, short = np.zeros(1000, np.int32), np.zeros(9, np.int32)
    corpus = data.Corpus("x", vocab, long, long, short, "x")
    with pytest.raises(DataError) as err:
        data.check_layout(corpus, 2, 4, accum=4, processes=2)
    assert str(err.value) == (
        "x: the test split has 9 tokens, too few for BATCH_SIZE=2 streams of SEQ_LEN+1=5 "
        "tokens (at least 10 tokens); use BATCH_SIZE=1 or less (at SEQ_LEN=4), or SEQ_LEN=3 or "
        "less (at BATCH_SIZE=2), or more text")
    data.check_layout(dataclasses.replace(corpus, test=np.zeros(10, np.int32)), 2, 4, accum=4,
                      processes=2)


def test_the_words_of_a_subword_split_are_its_tokens_pieces() -> None:
    """" a" and "a" are one word; a line-end token is none; bytes of one character split
    over two tokens are still told apart (no false refusal of a non-Latin text)."""
    pytest.importorskip("tokenizers")
    from rustyflow_py.training.subword.tokenizer import train_bpe

    tok = train_bpe(TINY_TEXT + "猫 犬\n", 300)
    corpus = data.Corpus("t", tok, tok.encode(ONE_WORD), np.zeros(1, np.uint32),
                         np.zeros(1, np.uint32), "t", tokenizer=tok)
    assert data.trainable.distinct_words(corpus, 5) == ["a"]
    corpus.train = tok.encode("猫 犬\n" * 50)
    assert len(data.trainable.distinct_words(corpus, 5)) >= 2


@pytest.mark.parametrize(("changes", "message"), [
    ({"EMBED_DIM": 36, "NUM_HEADS": 3},
     "EMBED_DIM/NUM_HEADS = 12, from EMBED_DIM=36 (command line --embed-dim) and NUM_HEADS=3 "
     "(command line --num-heads): set EMBED_DIM=24 or 48 (at NUM_HEADS=3), or ATTENTION=auto"),
    ({"EMBED_DIM": 1024, "NUM_HEADS": 4},
     "EMBED_DIM/NUM_HEADS = 256, from EMBED_DIM=1024 (command line --embed-dim) and "
     "NUM_HEADS=4 (command line --num-heads): set NUM_HEADS=8 or 16 (at EMBED_DIM=1024), or "
     "EMBED_DIM=512 (at NUM_HEADS=4), or ATTENTION=auto"),
    ({"DROPOUT": 0.1},
     "the attention dropout is 0.1 (DROPOUT=0.1 (command line --dropout), which "
     "ATTN_DROPOUT=-1 follows): set ATTN_DROPOUT=0"),
])
@pytest.mark.usefixtures("tiny_dir")
def test_a_derived_value_is_named_by_the_keys_that_make_it(changes: dict[str, object],
                                                           message: str) -> None:
    """cuDNN's head size and attention dropout: the keys, their values and a fix that holds."""
    with pytest.raises(ConfigError) as err:
        make_cfg(ATTENTION="cudnn", PRECISION="bf16", **changes)
    assert message in str(err.value)
    for fix in re.findall(r"(NUM_HEADS|EMBED_DIM)=([\d ]+(?:or \d+)?) \(at", str(err.value)):
        for value in fix[1].split(" or "):
            make_cfg(ATTENTION="cudnn", PRECISION="bf16", **{**changes, fix[0]: int(value)})


def test_a_warm_up_longer_than_the_schedule_is_named(workspace: Path) -> None:
    """WARMUP_STEPS at or past the schedule's length trains, but says that the learning
    rate never reaches its peak, naming the keys."""
    result = invoke(*TRAIN, "--model-path", "models/w.npz", "--max-steps", "2",
                    "--warmup-steps", "29")
    assert result.exit_code == 0, result.output
    assert ("WARN: WARMUP_STEPS=29 is not shorter than the schedule's 29 steps (NUM_EPOCHS=1 x "
            "29): the learning rate never reaches LEARNING_RATE=0.01; set WARMUP_STEPS below "
            "29") in result.output
    quiet = invoke(*TRAIN, "--model-path", "models/v.npz", "--max-steps", "2")
    assert "WARMUP_STEPS" not in quiet.output
