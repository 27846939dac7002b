"""`rustyflow data info`: where a dataset was found, its files, checksums, tokens and vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import DataError, command
from .checksums import expected_sha256, sha256_of
from .load import load_corpus
from .lookup import find, folders, missing_error, search_dirs, searched
from .registry import SOURCES, SPLITS, unknown_dataset


def dataset_info(dataset: str, data_dir: str | None = None) -> dict[str, object]:
    """What `rustyflow data info` shows: location, files, checksums, token counts, vocab."""
    source = SOURCES.get(dataset)
    if source is None and not Path(dataset).is_file():
        raise unknown_dataset(dataset)
    dirs = search_dirs(data_dir)
    info: dict[str, object] = {"dataset": dataset, "title": source.title if source else dataset,
                               "looked_in": [str(f) for f, _ in folders(source, dirs)]
                               if source else [dataset]}
    if source is None:
        paths = {Path(dataset).name: Path(dataset)} if Path(dataset).is_file() else None
    else:
        paths = find(source, dirs)
    info["found"] = paths is not None
    if paths is None:
        if source is not None:
            info["searched"] = searched(source, dirs)
            info["problem"] = str(missing_error(dataset, source, dirs,
                                           "(`rustyflow data info` only looks, it never "
                                           "downloads.)"))
        return info
    files = []
    for name, path in paths.items():
        digest = sha256_of(path.read_bytes())
        expected = expected_sha256(source, name, path) if source else None
        files.append({"name": name, "path": str(path), "bytes": path.stat().st_size,
                      "sha256": digest, "expected_sha256": expected,
                      "checksum_ok": None if expected is None else digest == expected})
    info["location"] = str(next(iter(paths.values())).parent)
    info["files"] = files
    info["checksum_ok"] = all(f["checksum_ok"] is not False for f in files)
    try:
        corpus = load_corpus(dataset, data_dir, download=False)
    except DataError as err:
        info["error"] = str(err)
        return info
    info["vocab_size"] = len(corpus.vocab)
    info["tokens"] = {s: int(getattr(corpus, s).shape[0]) for s in SPLITS}
    info["test_is_valid"] = corpus.test_is_valid
    return info


def info_problem(info: dict[str, Any]) -> str | None:
    """Why a dataset_info() result is not usable as it is (missing, damaged), or None.

    `rustyflow data info` exits 1 with this line, so scripts can test a dataset before a run.
    """
    name = info["dataset"]
    if not info["found"]:
        return str(info.get("problem") or f"{name} not found")
    if info.get("checksum_ok") is False:
        bad = [f["name"] for f in info["files"] if f["checksum_ok"] is False]
        return (f"{name}: checksum mismatch in {', '.join(bad)}; delete the damaged files and "
                f"run `{command()} data download {name}`")
    if "error" in info:
        return f"{name}: {info['error']}"
    return None


def _file_line(entry: dict[str, Any]) -> str:
    """One file of `data info`: name, size and checksum state."""
    state = {True: "sha256 ok", False: f"sha256 MISMATCH (is {entry['sha256'][:12]}..., "
             f"expected {str(entry['expected_sha256'])[:12]}...)",
             None: "sha256 unrecorded"}[entry["checksum_ok"]]
    alias = "" if Path(entry["path"]).name == entry["name"] else f" ({Path(entry['path']).name})"
    return f"  {entry['name'] + alias:<32}{entry['bytes']:>14,} bytes  {state}"


def format_info(info: dict[str, Any]) -> str:
    """dataset_info() as lines for a terminal: where, files, checksums, tokens, vocabulary."""
    lines = [f"{info['title']} ({info['dataset']})"]
    if not info["found"]:
        lines.append("  not found (the error below lists where it looked)")
        return "\n".join(lines)
    lines.append(f"  location  {info['location']}")
    lines += [_file_line(entry) for entry in info["files"]]
    if "tokens" in info:
        tokens = info["tokens"]
        counts = [f"{split} {tokens[split]:,}" for split in SPLITS
                  if not (split == "test" and info.get("test_is_valid"))]
        same = " (test = valid: no official test split)" if info.get("test_is_valid") else ""
        lines.append(f"  tokens    {', '.join(counts)}{same}")
        lines.append(f"  vocab     {info['vocab_size']:,} words")
    if "error" in info:
        lines.append(f"  error     {info['error']}")
    return "\n".join(lines)
