"""Downloading a built-in dataset with pooch, verified, installed only when complete.

pooch does the HTTP(S) transfer (requests), the sha256 check of what arrives (a mismatch is
deleted), the retries of a failed URL and the progress bar. This module adds what pooch does
not: the mirrors tried in order, the archive's members found by their official names, the
checksum of every extracted file, and the install. Work happens in a temporary folder next to
the destination, and files are moved into place one by one with os.replace, so a visible file
is always complete and verified and a failure leaves nothing behind.

pooch is imported when a download starts, not with the package: training from local files
never pays for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import DataError
from .checksums import sha256_of
from .registry import SOURCES, Source, unknown_dataset

RETRIES = 2  # more tries of a failing URL before the next mirror (pooch waits 1 s, then 2 s)


class _Bar:
    """pooch's progress-bar protocol (total, update, reset, close) drawn by rich on stderr."""

    def __init__(self, label: str) -> None:
        self.label, self.total = label, 0
        self._bar: Any = None
        self._task: Any = None

    def update(self, n: int) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            self._bar = Progress("{task.description}", BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), console=Console(stderr=True),
                                 transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total or None)
        self._bar.advance(self._task, n)

    def reset(self) -> None:
        if self._bar is not None:
            self._bar.reset(self._task, total=self.total or None)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


class _Fetch:
    """pooch's HTTP downloader, remembering what arrived (size, sha256): the sha256 is checked
    here, not by pooch, whose retries would fetch a wrong file from the same URL again."""

    def __init__(self, url: str, timeout: float) -> None:
        import pooch

        bar = _Bar(Path(url).name) if sys.stderr.isatty() else False
        self._http = pooch.HTTPDownloader(timeout=timeout, progressbar=bar)
        self.received = 0
        self.digest: str | None = None

    def __call__(self, url: str, output_file: str, store: Any) -> None:
        self.digest = None
        try:
            self._http(url, output_file, store)
            self.digest = sha256_of(Path(output_file).read_bytes())
        finally:
            with contextlib.suppress(OSError):
                self.received = os.path.getsize(output_file)


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    """pooch logs each download with its temporary path; this module says what it fetches."""
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _fetch_first(urls: Sequence[str], folder: Path, name: str, expected: str | None,
                 timeout: float, retries: int) -> tuple[str, Path]:
    """Download `name` into `folder` (a fresh one) from the first URL that works and matches
    `expected`; return that URL and the file. A URL is retried on network errors only: a
    file that arrives with the wrong sha256 is discarded and the next URL tried."""
    import pooch
    import requests

    errors = []
    for url in urls:
        print(f"INFO: downloading {url}", file=sys.stderr)
        fetch = _Fetch(url, timeout)
        store = pooch.create(path=folder, base_url="", retry_if_failed=retries,
                             registry={name: None}, urls={name: url})
        try:
            with _quiet(pooch.get_logger()):
                path = Path(store.fetch(name, downloader=fetch))
        except requests.exceptions.ChunkedEncodingError:
            errors.append(f"{url}: connection closed after {fetch.received} bytes, before the "
                          f"end of the file")
            continue
        except (OSError, requests.exceptions.RequestException) as err:
            errors.append(f"{url}: {err}")
            continue
        if expected is None or fetch.digest == expected:
            return url, path
        path.unlink(missing_ok=True)
        errors.append(f"{url}: checksum mismatch (sha256 {fetch.digest}, expected "
                      f"{expected}); discarded")
    raise DataError("no URL worked: " + "; ".join(errors))


def _extract(archive: Path, url: str, source: Source, dest: Path) -> None:
    """Put the dataset's files, found in the zip by their official base names, into dest
    (the archive's own folder)."""
    import pooch

    try:  # extract_dir is relative to the archive's folder
        members = pooch.Unzip(extract_dir="unzipped")(str(archive), "download", None)
    except (zipfile.BadZipFile, EOFError) as err:
        raise DataError(f"{url}: not a valid zip archive ({err}); discarded") from None
    by_name = {Path(m).name: Path(m) for m in members}
    for name in source.files:
        official = source.aliases.get(name, name)
        if official not in by_name:
            raise DataError(f"{url}: the archive has no {official}")
        os.replace(by_name[official], dest / name)


def download_dataset(dataset: str, dest_dir: str | os.PathLike[str],
                     urls: Sequence[str] | None = None, *,
                     checksums: dict[str, str] | None = None, timeout: float = 30.0,
                     retries: int | None = None) -> Path:
    """Download, verify and install `dataset` into <dest_dir>/<folder>; return that folder.

    `urls` replaces the official list (the mirror is tried after the primary); `checksums`
    overrides expected sha256s by local file name, "archive" for the zip; `retries` is how
    often a failing URL is tried again (default RETRIES). Nothing is left behind on failure:
    work happens in a temporary folder inside dest_dir.
    """
    source = SOURCES.get(dataset)
    if source is None:
        raise unknown_dataset(dataset)
    expected = {**source.sha256, "archive": source.archive_sha256, **(checksums or {})}
    retries = RETRIES if retries is None else retries
    target = Path(dest_dir) / source.folder
    Path(dest_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{source.folder}-download-", dir=dest_dir))
    try:
        if source.archive_sha256 is None:
            url, _ = _fetch_first(urls or source.urls, tmp, source.files[0],
                                  expected.get(source.files[0]), timeout, retries)
        else:
            url, archive = _fetch_first(urls or source.urls, tmp, "archive",
                                        expected["archive"], timeout, retries)
            _extract(archive, url, source, tmp)
        for name in source.files:
            digest = sha256_of((tmp / name).read_bytes())
            if expected.get(name) is None:
                (tmp / f"{name}.sha256").write_text(f"{digest}  {name}\n")
            elif digest != expected[name]:
                raise DataError(f"{url}: checksum mismatch for {name} (sha256 {digest}, "
                                f"expected {expected[name]}); discarded")
        target.mkdir(exist_ok=True)
        for name in source.files:
            for path in (tmp / name, tmp / f"{name}.sha256"):
                if path.exists():
                    os.replace(path, target / path.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"INFO: {source.title} installed in {target}", file=sys.stderr)
    return target
