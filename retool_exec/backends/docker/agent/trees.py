"""Removing and copying a directory tree a call wrote: no recursion, no link followed.

Why not ``os.walk`` and ``shutil``: both recurse in Python (3.11), so a tree
nested ~1000 deep raised RecursionError out of the local backend's cleanup and
out of a session fork's copy (thirteenth red-team round), and both go by path,
which stops at PATH_MAX. Here every step is relative to an open directory
descriptor, and the descriptors held never grow past ``MAX_DEPTH`` levels.

Used by the agent (the reset's removal, a session fork's copy) and by the local
backend on the host, so the module keeps to Python 3.9 and the standard library.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any

MAX_DEPTH = 64
"""Levels of directories held open at once: the remover moves deeper ones up to its root
first; a copy refuses a deeper tree (``TooLarge``). Two descriptors a level, within a
sandbox's smallest descriptor limit (256)."""

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class BudgetExceeded(Exception):
    """Removal ran past its deadline."""


class TooLarge(Exception):
    """A tree is over a copy's limits. Not an OSError: callers tell it from a failed copy."""


# -- removal -------------------------------------------------------------------------------


def empty_directory(root: str, deadline: float) -> list[str]:
    """Remove everything under ``root`` (kept itself), without recursion or symlink following;
    the names left in ``root`` (none once it is empty).

    A stack of open directory descriptors walks the tree; a directory found
    deeper than MAX_DEPTH is renamed into ``root`` first, so the stack never
    grows past that depth, whatever the tree's shape or name lengths. Passes
    repeat until ``root`` is empty or a pass removes nothing more. What is left
    comes from the last listing, so a caller needs no listing of its own.
    """
    root_fd = os.open(root, _DIRECTORY)
    try:
        before: list[str] | None = None
        while True:
            names = _names(root_fd, deadline)
            if not names or names == before:
                return names
            before = names
            _one_pass(root_fd, deadline)
    finally:
        os.close(root_fd)


CHECK_EVERY = 256
"""Entries handled between two looks at the clock, inside one directory too: a flat
directory of millions of hard links (one inode) kept a reset removing for 4-6 s past
a 1 s deadline that was read only between directories (seventeenth red-team round)."""


def _check(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise BudgetExceeded("emptying ran past its deadline")


def _names(fd: int, deadline: float) -> list[str]:
    """The sorted names in directory ``fd``, listed by ``deadline``."""
    names = []
    with os.scandir(fd) as entries:
        for count, entry in enumerate(entries, 1):
            if count % CHECK_EVERY == 0:
                _check(deadline)
            names.append(entry.name)
    return sorted(names)


def remove_tree(path: str) -> None:
    """Delete ``path`` and everything under it as far as possible; never raises.

    Directories the code made unreadable are opened up first. What cannot be
    removed stays (the caller has nothing better to do with the error).
    """
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            return  # the code moved its working directory away: nothing of ours is left there
        _quietly(os.chmod, path, 0o700)
        empty_directory(path, float("inf"))
        os.rmdir(path)
    except (OSError, BudgetExceeded):
        pass


def _one_pass(root_fd: int, deadline: float) -> None:
    """Remove what one walk of the tree can: each directory's listing is read once, and
    a directory emptied below is removed by name as its parent's listing resumes.

    Why resumed: the parent's listing restarted after each directory emptied below it,
    so every directory was listed twice (and its names looked up twice): the reset and
    the local backend's removal did twice the work they need (the thirty-fourth
    red-team round's deep trees)."""
    # One frame a directory being emptied: its descriptor, its names left, its name. The
    # names are read whole (``_names``): one descriptor a level, as before.
    stack: list[tuple[int, Iterator[str], str]] = [(root_fd, iter(_names(root_fd, deadline)), "")]
    moved = 0
    handled = 0
    try:
        while stack:
            _check(deadline)
            fd, entries, name = stack[-1]
            below: tuple[int, Iterator[str], str] | None = None
            for entry in entries:
                handled += 1
                if handled % CHECK_EVERY == 0:
                    _check(deadline)
                below, moved = _empty_entry(
                    entry, fd, root_fd, len(stack), moved, deadline=deadline
                )
                if below is not None:
                    break
            if below is not None:
                stack.append(below)
                continue
            stack.pop()
            if stack:  # emptied as far as it goes: removed from its parent if it can be
                os.close(fd)
                _quietly(os.rmdir, name, dir_fd=stack[-1][0])
    finally:
        for fd, _, _ in stack:
            if fd != root_fd:
                os.close(fd)


def _empty_entry(
    name: str, fd: int, root_fd: int, depth: int, moved: int, *, deadline: float
) -> tuple[tuple[int, Iterator[str], str] | None, int]:
    """Remove entry ``name`` of directory ``fd`` if it can go at once, else move it up to
    the root (past ``MAX_DEPTH``) or give its frame to empty next; and the count of
    directories moved up (their new names' serial)."""
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None, moved
    if not stat.S_ISDIR(info.st_mode):
        _quietly(os.unlink, name, dir_fd=fd)
        return None, moved
    _quietly(os.chmod, name, 0o700, dir_fd=fd, follow_symlinks=False)
    try:
        os.rmdir(name, dir_fd=fd)
        return None, moved
    except OSError:
        pass
    if depth >= MAX_DEPTH:
        moved += 1
        flat = f".flat-{moved}-{info.st_ino}"
        _quietly(os.rename, name, flat, src_dir_fd=fd, dst_dir_fd=root_fd)
        return None, moved
    try:
        child = os.open(name, _DIRECTORY, dir_fd=fd)
    except OSError:
        return None, moved  # cannot be opened: what is left is reported by the caller's check
    try:
        return (child, iter(_names(child, deadline)), name), moved
    except BaseException:
        os.close(child)
        raise


def _quietly(func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        func(*args, **kwargs)
    except (OSError, NotImplementedError):
        pass  # verification reports what could not be removed


# -- copying -------------------------------------------------------------------------------


class _Budget:
    """What a copy may still take: names, bytes (as files state their size) and levels."""

    def __init__(self, max_bytes: int | None, max_entries: int | None) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.bytes_left = max_bytes
        self.entries_left = max_entries

    def spend(self, entries: int = 0, size: int = 0) -> None:
        if self.entries_left is not None:
            self.entries_left -= entries
        if self.bytes_left is not None:
            self.bytes_left -= size
        if (self.entries_left is not None and self.entries_left < 0) or (
            self.bytes_left is not None and self.bytes_left < 0
        ):
            raise TooLarge(
                f"the directory holds more than {_text(self.max_bytes, 20, 'MiB')} or "
                f"{_text(self.max_entries, 0, 'names')}, a fork's most"
            )


def _text(limit: int | None, shift: int, unit: str) -> str:
    return f"any number of {unit}" if limit is None else f"{limit >> shift} {unit}"


def copy_tree(
    source: str,
    target: str,
    *,
    max_bytes: int | None = None,
    max_entries: int | None = None,
) -> None:
    """Copy what is under ``source`` into the existing directory ``target``.

    Directories and regular files (contents, mode and times), links as links
    (never followed), named pipes made anew; sockets and devices are left out.
    A tree over the limits (``max_bytes`` as files state their size, so a sparse
    file counts in full; ``max_entries`` names; ``MAX_DEPTH`` levels) raises
    ``TooLarge``: measured before anything is written, stopping at the limit,
    and spent again while copying (the source may still be changing). A file
    that grows while it is copied is copied up to the size it had.
    """
    source_fd = os.open(source, _DIRECTORY)
    try:
        _walk(source_fd, None, _Budget(max_bytes, max_entries))
        target_fd = os.open(target, _DIRECTORY)
        try:
            _walk(source_fd, target_fd, _Budget(max_bytes, max_entries))
        finally:
            os.close(target_fd)
    finally:
        os.close(source_fd)


def _walk(source_root: int, target_root: int | None, budget: _Budget) -> None:
    """Measure the tree under ``source_root`` (``target_root`` None) or copy it there."""
    # One frame a directory being read: (source fd, target fd, names left, its stat).
    stack: list[tuple[int, int | None, Any, os.stat_result | None]] = [
        (source_root, target_root, os.scandir(source_root), None)
    ]
    try:
        while stack:
            source, target, entries, info = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                entries.close()
                if info is not None:  # a directory below the roots: ours to close
                    try:
                        if target is not None:
                            os.fchmod(target, stat.S_IMODE(info.st_mode))
                            os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
                    finally:
                        if target is not None:
                            os.close(target)
                        os.close(source)
                continue
            budget.spend(entries=1)
            child = _copy_entry(entry.name, source, target, budget, len(stack))
            if child is not None:
                stack.append(child)
    finally:
        for source, target, entries, info in stack:
            entries.close()
            if info is not None:
                os.close(source)
                if target is not None:
                    os.close(target)


def _copy_entry(
    name: str, source: int, target: int | None, budget: _Budget, depth: int
) -> tuple[int, int | None, Any, os.stat_result] | None:
    """Copy one entry (or only measure it); a directory's frame to walk next, if it is one."""
    try:
        info = os.stat(name, dir_fd=source, follow_symlinks=False)
    except FileNotFoundError:
        return None  # gone since it was listed
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        if depth >= MAX_DEPTH:
            raise TooLarge(f"the directory is nested more than {MAX_DEPTH} levels deep")
        source_child = os.open(name, _DIRECTORY, dir_fd=source)
        target_child = None
        try:
            if target is not None:
                os.mkdir(name, 0o700, dir_fd=target)
                target_child = os.open(name, _DIRECTORY, dir_fd=target)
            return source_child, target_child, os.scandir(source_child), info
        except BaseException:
            os.close(source_child)
            if target_child is not None:
                os.close(target_child)
            raise
    if stat.S_ISREG(mode):
        budget.spend(size=info.st_size)
    if target is None:
        return None  # only measuring
    if stat.S_ISREG(mode):
        _copy_file(name, source, target)
    elif stat.S_ISLNK(mode):
        os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=target)
        times = (info.st_atime_ns, info.st_mtime_ns)
        _quietly(os.utime, name, ns=times, dir_fd=target, follow_symlinks=False)
    elif stat.S_ISFIFO(mode):
        os.mkfifo(name, stat.S_IMODE(mode), dir_fd=target)
    return None  # a socket or a device: not copied


def _copy_file(name: str, source: int, target: int) -> None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    reader = os.open(name, flags, dir_fd=source)
    try:
        info = os.fstat(reader)
        if not stat.S_ISREG(info.st_mode):
            return  # swapped for something else since it was measured
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        writer = os.open(name, create, 0o600, dir_fd=target)
        try:
            left = info.st_size
            while left > 0:
                chunk = os.read(reader, min(left, 1 << 20))
                if not chunk:
                    break
                _write_all(writer, chunk)
                left -= len(chunk)
            os.fchmod(writer, stat.S_IMODE(info.st_mode))
            os.utime(writer, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(writer)
    finally:
        os.close(reader)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
