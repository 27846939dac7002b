"""Config parsing: precedence, interpolation, validation messages and the shipped config.env."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import load_script

from rustyflow_py.training.config.config import (
    KEYS,
    Config,
    ConfigError,
    load_config,
    markdown_table,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every test where no stray config.env can be picked up."""
    monkeypatch.chdir(tmp_path)


def write(tmp_path: Path, text: str, name: str = "run.env") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_without_a_file() -> None:
    config, warnings = load_config(environ={})
    assert config == Config() and warnings == []
    assert config.batch_size == 16 and config.learning_rate == 1e-3 and config.nesterov is False
    assert set(config.source.values()) == {"default"}


def test_config_fields_follow_keys() -> None:
    names = [f.name for f in dataclasses.fields(Config) if f.name != "source"]
    assert names == [key.attr for key in KEYS.values()]
    assert KEYS["BATCH_SIZE"].flag == "--batch-size"
    assert KEYS["OPTIMIZER"].choices == ("adamw", "adam", "sgd", "lamb", "rmsprop", "adagrad",
                                         "adadelta", "muon")


def test_precedence_cli_over_env_over_file_over_default(tmp_path: Path) -> None:
    path = write(tmp_path, "BATCH_SIZE=8\nSEQ_LEN=32\nLEARNING_RATE=0.01\nDEVICE=cpu\n")
    environ = {"BATCH_SIZE": "4", "SEQ_LEN": "16", "UNRELATED": "x"}
    overrides = {"BATCH_SIZE": "2", "DEVICE": None, "PROFILE": False}
    config, warnings = load_config(path, overrides, environ)
    assert (config.batch_size, config.seq_len, config.learning_rate) == (2, 16, 0.01)
    assert (config.device, config.num_layers, config.profile) == ("cpu", 2, False)
    assert config.source["BATCH_SIZE"] == "cli" and config.source["SEQ_LEN"] == "env"
    assert config.source["LEARNING_RATE"] == f"file:{path}"
    assert config.source["NUM_LAYERS"] == "default" and warnings == []


def test_path_none_reads_config_env_in_cwd(tmp_path: Path) -> None:
    write(tmp_path, "NUM_EPOCHS=3\n", "config.env")
    config, _ = load_config(environ={})
    assert config.num_epochs == 3 and config.source["NUM_EPOCHS"] == "file:config.env"


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.env: config file not found"):
        load_config(tmp_path / "nope.env", environ={})


def test_interpolation_from_file_and_environment(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RF_TEST_ROOT", "/datasets")
    path = write(tmp_path, "RUN=exp1\nNUM_LAYERS=3\nDATA_DIR=${RF_TEST_ROOT}/text\n"
                           "MODEL_PATH=runs/${RUN}-L${NUM_LAYERS}.npz\n")
    config, warnings = load_config(path, environ={})
    assert config.data_dir == "/datasets/text"
    assert config.model_path == "runs/exp1-L3.npz"
    assert warnings == []  # RUN is unknown but used by ${RUN}: no warning


def test_file_model_path_is_fixed_at_read_time_and_warns(tmp_path: Path) -> None:
    path = write(tmp_path, "NUM_LAYERS=3\nMODEL_PATH=m-L${NUM_LAYERS}.npz\nLOG_FILE=${NOPE}x\n")
    config, warnings = load_config(path, {"NUM_LAYERS": 5}, environ={})
    assert config.num_layers == 5 and config.model_path == "m-L3.npz"
    assert any("${NUM_LAYERS}" in w and "--num-layers" in w for w in warnings)
    assert any("${NOPE}" in w and "expands to ''" in w for w in warnings)


def test_model_path_default_follows_final_values(tmp_path: Path) -> None:
    config, _ = load_config(overrides={"NUM_LAYERS": "4", "EMBED_DIM": 256}, environ={})
    assert config.model_path == "models/wikitext-2-L4-H4-E256.npz"
    text = write(tmp_path, "hello world\n", "poems.txt")
    config, _ = load_config(environ={"DATASET": str(text), "MODEL_PATH": ""})
    assert config.model_path == "models/poems-L2-H4-E128.npz"


def test_model_path_for_device() -> None:
    config = Config()
    assert config.model_path_for("gpu") == "models/wikitext-2-L2-H4-E128-gpu.npz"
    assert config.model_path_for("cpu") == "models/wikitext-2-L2-H4-E128-cpu.npz"
    tagged = Config(model_path="models/x-gpu.npz")
    assert tagged.model_path_for("gpu") == "models/x-gpu.npz"
    with pytest.raises(ValueError):
        config.model_path_for("tpu")


BAD_VALUES = [
    ("BATCH_SIZE", "abc", "a positive integer"),
    ("BATCH_SIZE", "-1", "a positive integer"),
    ("SEQ_LEN", "0", "a positive integer"),
    ("NUM_HEADS", "2.5", "a positive integer"),
    ("MAX_STEPS", "-5", "an integer >= 0"),
    ("LEARNING_RATE", "fast", "a finite number > 0"),
    ("LEARNING_RATE", "0", "a finite number > 0"),
    ("DROPOUT", "nan", "a finite number in [0, 1)"),
    ("DROPOUT", "1", "a finite number in [0, 1)"),
    ("TOP_P", "0", "a finite number in (0, 1]"),
    ("GRAD_CLIP", "inf", "a finite number >= 0"),
    ("SEED", "-1", "an integer in [0, 4294967295]"),
    ("NESTEROV", "maybe", "true or false"),
    ("DEVICE", "GPU", "one of auto, cpu, gpu"),
    ("OPTIMIZER", "adamax", "one of adamw, adam, sgd, lamb, rmsprop, adagrad, adadelta, muon"),
    ("NS_STEPS", "0", "an integer in [1, 50]"),
    ("RHO", "1", "a finite number in [0, 1)"),
    ("ADAGRAD_EPS", "0", "a finite number > 0"),
    ("MUON_LR", "-0.02", "a finite number > 0"),
    ("LOG_FILE", "", "a non-empty string"),
    ("MODEL_PATH", "model.pt", "a path ending in .npz"),
    ("DATASET", "wikitext2", "did you mean wikitext-2?"),
]


@pytest.mark.parametrize(("key", "value", "expect"), BAD_VALUES)
def test_bad_value_in_file_names_key_value_file_and_expectation(
        tmp_path: Path, key: str, value: str, expect: str) -> None:
    path = write(tmp_path, f"{key}={value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    message = str(err.value)
    assert message.startswith(f"{path}: {key}='{value}' is not valid: expected")
    assert expect in message


def test_bad_value_origin_environment_and_command_line() -> None:
    with pytest.raises(ConfigError, match=r"^environment: BATCH_SIZE='x' is not valid"):
        load_config(environ={"BATCH_SIZE": "x"})
    with pytest.raises(ConfigError, match=r"^command line --num-layers: NUM_LAYERS='0' is not"):
        load_config(overrides={"NUM_LAYERS": 0}, environ={})
    with pytest.raises(ConfigError, match="NUM_HEADS='True'"):  # a bool is not a count
        load_config(overrides={"NUM_HEADS": True}, environ={})
    with pytest.raises(ConfigError, match="unknown key 'BATCH'"):
        load_config(overrides={"BATCH": 3}, environ={})


def test_embed_dim_not_divisible_by_num_heads(tmp_path: Path) -> None:
    path = write(tmp_path, "EMBED_DIM=130\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={"NUM_HEADS": "4"})
    message = str(err.value)
    assert f"EMBED_DIM=130 ({path})" in message and "NUM_HEADS=4 (environment)" in message
    assert "multiple of NUM_HEADS" in message and "EMBED_DIM=128 or 132" in message
    assert "NUM_HEADS=5 or 2" in message


@pytest.mark.parametrize(("text", "value"), [("TRUE", True), ("yes", True), ("On", True),
                                             ("1", True), ("off", False), ("No", False)])
def test_booleans(text: str, value: bool) -> None:
    config, _ = load_config(environ={"STRICT_DEVICE": text})
    assert config.strict_device is value


def test_unknown_key_and_unparsable_line_warn(tmp_path: Path) -> None:
    path = write(tmp_path, "BATCHSIZE=3\nbatch_size=4\nthis is not a setting\nSEQ_LEN=8\n")
    config, warnings = load_config(path, environ={}, allow_unknown_keys=True)
    assert config.seq_len == 8 and config.batch_size == 16
    assert f"{path} line 1: unknown key 'BATCHSIZE' ignored (did you mean BATCH_SIZE?)" in warnings
    assert f"{path} line 2: unknown key 'batch_size' ignored (did you mean BATCH_SIZE?)" in warnings
    assert any("could not parse statement starting at line 3" in w for w in warnings)


def test_shipped_config_env_is_in_sync_with_keys() -> None:
    shipped = REPO / "config.env"
    config, warnings = load_config(shipped, environ={})
    assert warnings == []
    assert config == Config()
    text = shipped.read_text()
    undocumented = [k for k in KEYS if not re.search(rf"^(# )?{k}=", text, re.M)]
    assert undocumented == [], "run scripts/sync_config_docs.py to add them"


def _sync_script() -> Any:
    return load_script(REPO / "scripts" / "sync_config_docs.py")


def test_readme_key_table_is_in_sync_with_keys() -> None:
    """docs/configuration.md's key table is markdown_table()'s output, row for row."""
    lines = (REPO / "docs" / "configuration.md").read_text().splitlines()
    table = markdown_table()
    assert table[0] in lines, "docs/configuration.md lacks the configuration table"
    start = lines.index(table[0])
    fix = "run scripts/sync_config_docs.py"
    assert lines[start : start + len(table)] == table, fix
    assert not lines[start + len(table)].startswith("|"), f"the key table has extra rows: {fix}"


def test_sync_script_restores_a_missing_key_in_docs_and_config_env() -> None:
    """Adding a key is one declaration: the script writes its table row and config.env entry."""
    sync = _sync_script()
    docs = (REPO / "docs" / "configuration.md").read_text()
    env = (REPO / "config.env").read_text()
    assert sync.synced_table(docs) == docs and sync.synced_env(env) == env
    row = next(line for line in docs.splitlines() if line.startswith("| `PATIENCE`"))
    assert sync.synced_table(docs.replace(row + "\n", "")) == docs
    without = re.sub(r"^PATIENCE=.*\n", "", env, flags=re.M)
    added = sync.synced_env(without).splitlines()
    entry = sync._entry(KEYS["PATIENCE"])  # its help as a comment, then PATIENCE=0
    assert entry[-1] == "PATIENCE=0" and entry[0].startswith("# Stop after")
    after = next(i for i, line in enumerate(added) if line.startswith("EVAL_INTERVAL="))
    assert added[after + 1 : after + 1 + len(entry)] == entry  # after the key declared before


def test_to_dict_from_dict_round_trip() -> None:
    config, _ = load_config(overrides={"NUM_LAYERS": 3, "OPTIMIZER": "sgd",
                                       "NESTEROV": "yes", "DROPOUT": "0.25"}, environ={})
    stored = json.loads(json.dumps(config.to_dict()))
    again = Config.from_dict({**stored, "NOT_A_KEY": 1})
    assert again == config and again.source["NUM_LAYERS"] == "checkpoint"
    assert list(stored) == list(KEYS)
    with pytest.raises(ConfigError, match="checkpoint: SEQ_LEN='-3'"):
        Config.from_dict({**stored, "SEQ_LEN": -3})


@pytest.mark.parametrize(("text", "why"), [
    ("", "it is empty"),
    ("# BATCH_SIZE=8\n\n   \n", "it holds only comments"),
    ("batch size 8\nSEQ_LEN 16\n", "line 1 'batch size 8' is not KEY=VALUE"),
])
def test_file_without_any_setting_is_an_error(tmp_path: Path, text: str, why: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    message = str(err.value)
    assert message.startswith(f"{path}: no KEY=VALUE setting found ({why}): expected lines such "
                              f"as BATCH_SIZE=16")
    assert "not a run on the built-in defaults" in message
    write(tmp_path, text, "config.env")  # picked up implicitly: the same error
    with pytest.raises(ConfigError, match="^config.env: no KEY=VALUE setting found"):
        load_config(environ={})


def test_control_characters_are_escaped_in_warnings_and_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "BAD\x1b[31mKEY=1\n\u202eEVIL=2\nSEQ_LEN=8\n")
    config, warnings = load_config(path, environ={}, allow_unknown_keys=True)
    assert config.seq_len == 8
    assert f"{path} line 1: unknown key 'BAD\\x1b[31mKEY' ignored" in warnings
    assert f"{path} line 2: unknown key '\\u202eEVIL' ignored" in warnings
    assert all(w.isprintable() for w in warnings)
    path = write(tmp_path, "BATCH_SIZE=\x1b[2J\x07\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert str(err.value).startswith(f"{path}: BATCH_SIZE='\\x1b[2J\\x07' is not valid")
    errors = []
    for environ, overrides in (({"DATASET": "wiki\x1btext"}, {}), ({}, {"BAT\tCH": 1}),
                               ({"MODEL_PATH": "m-${A\x1b}.npz"}, {})):
        with pytest.raises(ConfigError) as err:
            load_config(overrides=overrides, environ=environ)
        errors.append(str(err.value))
    assert all(e.isprintable() for e in errors) and "\\x1b" in errors[0] and "\\t" in errors[1]


@pytest.mark.parametrize("recipe", sorted((REPO / "configs").glob("*.env")),
                         ids=lambda p: p.name)
def test_shipped_recipes_load_and_validate(recipe: Path) -> None:
    config, warnings = load_config(recipe, environ={})
    assert warnings == []
    assert config.source["SEQ_LEN"].startswith("file:")


def test_the_seed_recipe_is_config_env() -> None:
    assert load_config(REPO / "configs" / "seed.env", environ={})[0] == Config()
    names = {p.name for p in (REPO / "configs").glob("*.env")}
    assert {"seed.env", "small.env", "medium.env", "wikitext2-quality.env"} <= names
