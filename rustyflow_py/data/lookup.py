"""Finding a built-in dataset on disk, in one order for every command: --data-dir / DATA_DIR,
$RUSTYFLOW_DATA_DIR, ./data, ../shared/data; and the one "not found" error that lists every
folder looked in, why nothing was downloaded and the three ways to fix it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from ..errors import DataError, command
from .registry import SOURCES, Source

LOOKUP = "--data-dir / DATA_DIR, then $RUSTYFLOW_DATA_DIR, ./data and ../shared/data"


def search_dirs(data_dir: str | os.PathLike[str] | None = None) -> list[tuple[Path, str]]:
    """Data folders in lookup order, each with where it came from (for messages): DATA_DIR
    (the --data-dir flag or the config key), $RUSTYFLOW_DATA_DIR, ./data, ../shared/data.

    A folder that was named (DATA_DIR, $RUSTYFLOW_DATA_DIR) but does not exist is a
    DataError, never a fallback to the other folders: the run would otherwise silently read
    data from somewhere else, or download it. Relative folders are relative to the working
    directory, as every path rustyflow is given."""
    env = os.environ.get("RUSTYFLOW_DATA_DIR")
    for folder, name, fix in ((data_dir, "DATA_DIR", "(--data-dir or DATA_DIR), or leave it "
                               "empty to look in $RUSTYFLOW_DATA_DIR, ./data and ../shared/data"),
                              (env, "RUSTYFLOW_DATA_DIR", "(the environment variable), or "
                               "unset it to look in ./data and ../shared/data")):
        if folder and not Path(folder).is_dir():
            full = "" if Path(folder).is_absolute() else f" ({Path(folder).absolute()})"
            raise DataError(f"{name}={folder}{full} does not exist or is not a folder: fix the "
                            f"path {fix}")
    candidates = [(data_dir, "DATA_DIR"), (env, "$RUSTYFLOW_DATA_DIR"), ("data", "./data"),
                  (os.path.join("..", "shared", "data"), "../shared/data")]
    found: dict[Path, str] = {}
    for folder, label in candidates:
        if folder:
            found.setdefault(Path(os.path.abspath(folder)), label)
    return list(found.items())


def folders(source: Source, dirs: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    """Folders that may hold the files: <dir>/<folder>, or <dir> itself if it is named so."""
    out = []
    for folder, label in dirs:
        out.append((folder / source.folder, label))
        if folder.name == source.folder:
            out.append((folder, label))
    return out


def _locate(source: Source, folder: Path) -> dict[str, Path | None]:
    """Each file of `source` in `folder` (canonical or official name), None where absent."""
    paths = {}
    for name in source.files:
        hits = [folder / n for n in (name, source.aliases.get(name)) if n]
        paths[name] = next((p for p in hits if p.is_file()), None)
    return paths


def find(source: Source, dirs: list[tuple[Path, str]]) -> dict[str, Path] | None:
    """The first folder holding every file (canonical or official name), or None."""
    for folder, _ in folders(source, dirs):
        paths = _locate(source, folder)
        if all(paths.values()):
            return paths  # type: ignore[return-value]
    return None


def searched(source: Source, dirs: list[tuple[Path, str]]) -> list[dict[str, Any]]:
    """Every folder looked in, whether its data folder exists, and which files it holds.

    A folder with some files but not all (say train.txt alone) is the usual half-finished
    copy; naming what is there and what is not saves guessing why it was "not found".
    """
    out = []
    for root, label in dirs:
        for folder, _ in folders(source, [(root, label)]):
            paths = _locate(source, folder)
            out.append({"folder": str(folder), "from": label, "root": str(root),
                        "exists": root.is_dir(),
                        "found": [p.name for p in paths.values() if p],
                        "missing": [name for name, p in paths.items() if p is None]})
    return out


def _searched_line(entry: dict[str, Any]) -> str:
    """One folder of the "looked in" list, with why nothing usable was there."""
    notes = [entry["from"]]
    if not entry["exists"]:
        notes.append(f"{entry['root']} does not exist")
    elif entry["found"]:
        notes.append(f"found {', '.join(entry['found'])}; missing {', '.join(entry['missing'])}")
    return f"  {entry['folder']}  ({'; '.join(notes)})"


def where_found(dataset: str, data_dir: str | None = None) -> str:
    """Where `dataset` would be read from, in words, without reading it (for banners)."""
    source = SOURCES.get(dataset)
    if source is None:
        return str(Path(dataset).absolute()) if Path(dataset).is_file() else "not found"
    dirs = search_dirs(data_dir)
    paths = find(source, dirs)
    if paths is None:
        return "not found locally: train downloads it into ./data"
    folder = next(iter(paths.values())).parent
    label = next((lbl for f, lbl in folders(source, dirs) if f == folder), "")
    return f"{folder}" + (f" (from {label})" if label else "")


def missing_error(dataset: str, source: Source, dirs: list[tuple[Path, str]],
                  why: str) -> DataError:
    """The one "not found" error: what is needed, every folder looked in, why nothing was
    downloaded, and the three ways to fix it."""
    names = ", ".join(source.files)
    official = ", ".join(source.aliases[n] for n in source.files if n in source.aliases)
    looked = "\n".join(_searched_line(entry) for entry in searched(source, dirs))
    return DataError(
        f"{source.title} not found: need {names}"
        f"{f' (or the official {official})' if official else ''} in one of:\n{looked}\n"
        f"{why}\nThree ways to fix it:\n"
        f"  1. copy the files into one of those folders (e.g. ./data/{source.folder}/);\n"
        f"  2. point at a folder holding {source.folder}/: --data-dir DIR, DATA_DIR=DIR in "
        f"config.env, or the environment variable RUSTYFLOW_DATA_DIR=DIR;\n"
        f"  3. download it: `{command()} data download {dataset}` (from {source.urls[0]}, "
        f"checksums verified; on an offline machine, run it elsewhere and copy ./data over).")


def default_download_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The first resolution folder that exists (./data is created) and is writable.

    DATA_DIR and $RUSTYFLOW_DATA_DIR are never created: a typo there would otherwise become a
    new folder holding the download while the intended one stays empty, so search_dirs
    refuses a missing one.
    """
    dirs = search_dirs(data_dir)
    for folder, _ in dirs:
        if folder == Path("data").absolute():
            with contextlib.suppress(OSError):
                folder.mkdir(parents=True, exist_ok=True)
        if folder.is_dir() and os.access(folder, os.W_OK):
            return folder
    raise DataError("no writable data folder among: " + ", ".join(str(d) for d, _ in dirs))
