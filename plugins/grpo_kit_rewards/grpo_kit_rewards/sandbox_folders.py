"""The program's folder when it runs unconfined: a temporary folder on the trainer's disk, locked while in use,
removed whatever the program did to the modes inside it, and swept at the next start when a killed run left one.

(In the sandbox the program's folder is a tmpfs in the sandbox's own mount namespace, gone with it.)
"""

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator

PREFIX = "grpo_kit-sandbox-"
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def folder() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix=PREFIX)
    lock = os.open(path, FOLDER_FLAGS)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while in use, released when this process ends: sweep() waits for it
        yield path
    finally:
        try:
            remove(path)
        finally:
            os.close(lock)


def sweep(directory: str | None = None) -> int:
    """Removes the folders that runs killed before their clean-up left in `directory` (the temporary folder); the
    number removed. A folder whose lock is held belongs to a program running now, in this run or another."""
    removed = 0
    for entry in os.scandir(directory or tempfile.gettempdir()):
        if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
            continue
        with contextlib.suppress(FileNotFoundError):  # another run's sweep took it first
            lock = os.open(entry.path, FOLDER_FLAGS)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            finally:
                os.close(lock)
            remove(entry.path)
            removed += 1
    return removed


def remove(path: str) -> None:
    """Removes a folder and everything in it, as its owner: each folder is made accessible (0700) before it is
    entered, links are removed and never followed, and two descriptors at most are open, however deep it goes."""
    os.chmod(path, 0o700)
    fd = os.open(path, FOLDER_FLAGS)
    pending = [_remove_files(fd)]  # each level's folders still to remove
    names = []  # the folders entered below `path`
    try:
        while pending:
            if pending[-1]:
                name = pending[-1].pop()
                os.chmod(name, 0o700, dir_fd=fd)
                inner = os.open(name, FOLDER_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = inner
                names.append(name)
                pending.append(_remove_files(fd))
                continue
            pending.pop()
            if names:
                outer = os.open("..", FOLDER_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = outer
                os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def _remove_files(fd: int) -> list[str]:
    """Unlinks everything in the folder `fd` but its folders; their names."""
    folders = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                folders.append(entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
    return folders
