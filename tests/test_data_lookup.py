"""The data lookup matrix: each source in its order, and each error message.

One order for every command: --data-dir / DATA_DIR > $RUSTYFLOW_DATA_DIR > ./data >
../shared/data > download. Every "not found" lists the folders and the three fixes; a given
DATA_DIR that does not exist is an error; an unknown name gets a did-you-mean, never a
download offer.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from rustyflow_py import data
from rustyflow_py.cli import main
from rustyflow_py.data import DataError

SPLITS = {"train.txt": "a b c\n", "valid.txt": "a b\n", "test.txt": "b c\n"}
SOURCES = ("flag", "env", "local", "shared")
DOWNLOAD = data.download_dataset  # the real one: it refuses an unknown name before any network


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder `work/` whose ../shared/data is tmp_path/shared/data, with the
    fixture texts standing for WikiText-2 and no download possible."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("RUSTYFLOW_DATA_DIR", raising=False)
    sums = {n: hashlib.sha256(t.encode()).hexdigest() for n, t in SPLITS.items()}
    monkeypatch.setitem(data.SOURCES, "wikitext-2",
                        dataclasses.replace(data.SOURCES["wikitext-2"], sha256=sums))

    def offline(*args: object, **kwargs: object) -> Path:
        raise DataError("no network in tests")

    monkeypatch.setattr(data.download, "download_dataset", offline)
    return work


def place(root: Path) -> Path:
    """The fixture splits in root/wikitext-2; that folder."""
    folder = root / "wikitext-2"
    folder.mkdir(parents=True)
    for name, text in SPLITS.items():
        (folder / name).write_text(text)
    return folder


def roots(cwd: Path) -> dict[str, Path]:
    """Where each source keeps its copy."""
    base = cwd.parent
    return {"flag": base / "flagged", "env": base / "env", "local": cwd / "data",
            "shared": base / "shared" / "data"}


@pytest.mark.parametrize("first", SOURCES)
def test_each_source_wins_over_the_ones_after_it(cwd: Path, first: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With a copy in `first` and every later source, `first`'s copy is read."""
    where = roots(cwd)
    for name in SOURCES[SOURCES.index(first):]:
        place(where[name])
    if (where["env"]).is_dir():
        monkeypatch.setenv("RUSTYFLOW_DATA_DIR", str(where["env"]))
    flag = str(where["flag"]) if first == "flag" else None
    assert data.load_corpus("wikitext-2", flag).source == str(where[first] / "wikitext-2")


def test_not_found_lists_every_folder_and_three_fixes(cwd: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    where = roots(cwd)
    where["env"].mkdir()
    monkeypatch.setenv("RUSTYFLOW_DATA_DIR", str(where["env"]))
    with pytest.raises(DataError) as err:
        data.load_corpus("wikitext-2")
    message = str(err.value)
    for name in ("env", "local", "shared"):
        assert str(where[name] / "wikitext-2") in message
    assert "Download failed: no network in tests" in message
    assert "Three ways to fix it" in message
    for fix in ("./data/wikitext-2/", "--data-dir DIR", "DATA_DIR=DIR",
                "RUSTYFLOW_DATA_DIR=DIR", " data download wikitext-2"):
        assert fix in message


def test_data_info_not_found_is_the_same_message(cwd: Path) -> None:
    result = CliRunner().invoke(main, ["data", "info"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "Error: WikiText-2 (v1, word level) not found" in result.stderr
    assert "RUSTYFLOW_DATA_DIR=DIR" in result.stderr and "Three ways" in result.stderr
    assert str(roots(cwd)["shared"] / "wikitext-2") in result.stderr


@pytest.mark.parametrize("command", [["data", "info", "--data-dir", "{dir}"],
                                     ["eval", "--model", "m-cpu.npz", "--data-dir", "{dir}"],
                                     ["train", "--data-dir", "{dir}", "--max-steps", "1"]])
def test_a_missing_data_dir_is_an_error_not_a_fallback(cwd: Path, command: list[str]) -> None:
    """Even with a usable copy in ./data, a --data-dir that does not exist stops the command."""
    place(roots(cwd)["local"])
    missing = cwd / "nonexistent"
    if command[0] == "eval":  # a checkpoint to evaluate: a 1-step run's
        trained = CliRunner().invoke(main, ["train", "--device", "cpu", "--max-steps", "1",
                                            "--batch-size", "1", "--seq-len", "1",
                                            "--model-path", "m-cpu.npz", "--no-profile"])
        assert trained.exit_code == 0, trained.output
    args = [a.replace("{dir}", str(missing)) for a in command]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"Error: DATA_DIR={missing} does not exist" in result.stderr


@pytest.mark.parametrize("command", [["data", "info", "wikitext2"],
                                     ["data", "download", "wikitext2"],
                                     ["train", "--dataset", "wikitext2"]])
def test_an_unknown_name_gets_a_did_you_mean_and_no_download(
        cwd: Path, command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data.download, "download_dataset", DOWNLOAD)
    result = CliRunner().invoke(main, command)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "did you mean wikitext-2?" in result.stderr
    assert "download" not in result.stderr.replace("data download wikitext2", "")
