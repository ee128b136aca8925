"""What a local fork copies of its parent's working directory, and where it stops."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retool_exec.backends import local
from retool_exec.backends.local import _copy_tree, _ForkTooLarge


def test_too_many_names_are_refused_before_the_directory_is_listed_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """copytree lists a whole directory before its ignore= hook sees it: a million names
    would all have been read before the refusal."""
    source = tmp_path / "parent"
    source.mkdir()
    for index in range(1000):
        (source / f"f{index}").touch()
    monkeypatch.setattr(local, "FORK_COPY_ENTRIES", 10)
    seen = 0
    real_scandir = os.scandir

    class Counted:
        def __init__(self, path: Any) -> None:
            self._entries = real_scandir(path)

        def __enter__(self) -> Iterator[os.DirEntry[str]]:
            return self._iterate()

        def __exit__(self, *exc_info: object) -> None:
            self._entries.close()

        def __iter__(self) -> Iterator[os.DirEntry[str]]:
            return self._iterate()

        def _iterate(self) -> Iterator[os.DirEntry[str]]:
            nonlocal seen
            for entry in self._entries:
                seen += 1
                yield entry

    monkeypatch.setattr(os, "scandir", Counted)
    with pytest.raises(_ForkTooLarge):
        _copy_tree(str(source), str(tmp_path / "copy"))
    assert seen <= 11


def test_links_pipes_and_files_are_copied_within_the_limits(tmp_path: Path) -> None:
    source = tmp_path / "parent"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "data").write_bytes(b"x" * 100)
    (source / "link").symlink_to("/nonexistent")
    os.mkfifo(source / "fifo")
    _copy_tree(str(source), str(tmp_path / "copy"))
    copy = tmp_path / "copy"
    assert (copy / "sub" / "data").read_bytes() == b"x" * 100
    assert os.readlink(copy / "link") == "/nonexistent"
    assert (copy / "fifo").is_fifo()
