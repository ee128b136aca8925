"""What a fork copies of its parent's working directory, and where it stops
(``trees.copy_tree``, used by the local backend and by Docker sessions), and the
removal of what a call left, without recursion."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retool_exec.backends import local
from retool_exec.backends.docker.agent import trees
from retool_exec.backends.local import _copy_tree


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

        def __enter__(self) -> Counted:
            return self

        def __exit__(self, *exc_info: object) -> None:
            self.close()

        def __iter__(self) -> Counted:
            return self

        def __next__(self) -> os.DirEntry[str]:
            nonlocal seen
            entry = next(self._entries)
            seen += 1
            return entry

        def close(self) -> None:
            self._entries.close()

    monkeypatch.setattr(os, "scandir", Counted)
    (tmp_path / "copy").mkdir()
    with pytest.raises(trees.TooLarge):
        _copy_tree(str(source), str(tmp_path / "copy"))
    assert seen <= 11


def test_links_pipes_and_files_are_copied_within_the_limits(tmp_path: Path) -> None:
    source = tmp_path / "parent"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "data").write_bytes(b"x" * 100)
    (source / "link").symlink_to("/nonexistent")
    os.mkfifo(source / "fifo")
    (tmp_path / "copy").mkdir()
    _copy_tree(str(source), str(tmp_path / "copy"))
    copy = tmp_path / "copy"
    assert (copy / "sub" / "data").read_bytes() == b"x" * 100
    assert os.readlink(copy / "link") == "/nonexistent"
    assert (copy / "fifo").is_fifo()


def _nested(root: Path, depth: int, name: str = "d") -> None:
    """``depth`` directories, one in the other, made by descriptor (past PATH_MAX too)."""
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            fd, old = os.open(name, os.O_RDONLY, dir_fd=fd), fd
            os.close(old)
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)


def test_a_copy_keeps_modes_times_and_paths_past_path_max(tmp_path: Path) -> None:
    source, copy = tmp_path / "parent", tmp_path / "copy"
    source.mkdir()
    copy.mkdir()
    _nested(source, trees.MAX_DEPTH - 1, "n" * 200)  # 12,600 characters of path
    (source / "ro").mkdir()
    (source / "ro" / "f").write_bytes(b"data")
    os.chmod(source / "ro" / "f", 0o640)
    os.utime(source / "ro" / "f", ns=(1, 2_000_000_000))
    os.chmod(source / "ro", 0o500)
    try:
        trees.copy_tree(str(source), str(copy))
        assert (copy / "ro" / "f").read_bytes() == b"data"
        info = os.stat(copy / "ro" / "f")
        assert (info.st_mode & 0o777, info.st_mtime_ns) == (0o640, 2_000_000_000)
        assert os.stat(copy / "ro").st_mode & 0o777 == 0o500
        depth, fd = 0, os.open(copy, os.O_RDONLY)
        while "leaf" not in os.listdir(fd):
            fd, old = os.open("n" * 200, os.O_RDONLY, dir_fd=fd), fd
            os.close(old)
            depth += 1
        os.close(fd)
        assert depth == trees.MAX_DEPTH - 1
    finally:
        for root in (source, copy):
            trees.remove_tree(str(root))
    assert os.listdir(tmp_path) == []


def test_a_tree_deeper_than_the_copy_holds_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    source, copy = tmp_path / "parent", tmp_path / "copy"
    source.mkdir()
    copy.mkdir()
    _nested(source, trees.MAX_DEPTH + 1)
    with pytest.raises(trees.TooLarge, match=f"{trees.MAX_DEPTH} levels"):
        trees.copy_tree(str(source), str(copy))
    assert os.listdir(copy) == []


def test_removal_has_no_depth_limit_and_never_raises(tmp_path: Path) -> None:
    """3000 levels (past Python's recursion limit and PATH_MAX), unreadable directories
    at the bottom and on the way, a link that must not be followed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine")
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    _nested(doomed, 3000)
    (doomed / "d" / "up").symlink_to(outside)
    os.chmod(doomed / "d", 0)
    trees.remove_tree(str(doomed))
    assert not doomed.exists()
    assert (outside / "keep").read_text() == "mine"
    trees.remove_tree(str(doomed))  # gone already: nothing to do
    (tmp_path / "file").write_text("x")
    trees.remove_tree(str(tmp_path / "file"))  # not a directory: left alone
    assert (tmp_path / "file").exists()


_NAMES = st.text(
    alphabet=st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
).filter(lambda name: name not in (".", ".."))
_TREES = st.recursive(
    st.one_of(st.binary(max_size=64), st.just("->link"), st.just("fifo")),
    lambda children: st.dictionaries(_NAMES, children, max_size=4),
    max_leaves=12,
)


def _build(path: Path, node: object) -> None:
    if isinstance(node, dict):
        path.mkdir()
        for name, child in node.items():
            _build(path / name, child)
    elif node == "->link":
        path.symlink_to("../elsewhere")
    elif node == "fifo":
        os.mkfifo(path)
    else:
        assert isinstance(node, bytes)
        path.write_bytes(node)


def _listing(root: Path) -> list[tuple[str, str, bytes | str | None]]:
    found = []
    for top, dirs, files in os.walk(root):  # shallow trees only: a test's own walk
        for name in sorted(dirs + files):
            path = Path(top) / name
            relative = str(path.relative_to(root))
            if path.is_symlink():
                found.append((relative, "link", os.readlink(path)))
            elif path.is_dir():
                found.append((relative, "dir", None))
            elif path.is_fifo():
                found.append((relative, "fifo", None))
            else:
                found.append((relative, "file", path.read_bytes()))
    return sorted(found)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tree=st.dictionaries(_NAMES, _TREES, max_size=5))
def test_a_copy_lists_the_same_as_its_source(tmp_path: Path, tree: dict[str, object]) -> None:
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    try:
        _build(work / "source", tree)
        (work / "copy").mkdir()
        trees.copy_tree(str(work / "source"), str(work / "copy"))
        assert _listing(work / "copy") == _listing(work / "source")
    finally:
        trees.remove_tree(str(work))
    assert not work.exists()
