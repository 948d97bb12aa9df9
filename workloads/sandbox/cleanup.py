"""What a killed evaluator leaves behind is removed by the next one.

Every `Sandbox` works in a directory `$TMPDIR/trex-sandbox-XXXX` holding an `owner` file: the pid
and kernel start time of the process that made it. Its processes die with it (bwrap's
--die-with-parent, parent-death signals), but a SIGKILL leaves no chance to delete files; so a
new `Sandbox` first removes the directories whose owner is gone. A pid alone could have been
reused by now; with its start time (field 22 of /proc/PID/stat) it names one process.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

BASE_PREFIX = "trex-sandbox-"
OWNER_FILE = "owner"


def process_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat_file:
            fields = stat_file.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19] if len(fields) > 19 else None  # field 22 overall; 20th after the command name


def mark_owner(directory: str) -> None:
    """Record this process as the owner of `directory`."""
    with open(os.path.join(directory, OWNER_FILE), "w", encoding="ascii") as owner:
        owner.write(f"{os.getpid()} {process_start_time(os.getpid())}\n")


def owner_alive(directory: str) -> bool | None:
    """Whether the process that made `directory` still runs; None when it has no owner file."""
    try:
        with open(os.path.join(directory, OWNER_FILE), encoding="ascii") as owner:
            pid_text, started = owner.read().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return process_start_time(pid) == started


def remove_abandoned_directories(root: str | None = None) -> list[str]:
    """Remove sandbox directories whose owner process is gone; returns what was removed."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        entries = os.listdir(root)
    except OSError:
        return removed
    for entry in entries:
        path = os.path.join(root, entry)
        if not entry.startswith(BASE_PREFIX) or not os.path.isdir(path) or os.path.islink(path):
            continue
        if owner_alive(path) is False:
            try:
                if os.stat(path).st_uid != os.geteuid():
                    continue  # another user's evaluator: not ours to remove
            except OSError:
                continue
            _remove_tree(path)
            removed.append(path)
    return removed


def _remove_tree(path: str) -> None:
    def make_writable(function, failed_path, _exc_info):
        try:
            os.chmod(os.path.dirname(failed_path), stat.S_IRWXU)
            os.chmod(failed_path, stat.S_IRWXU)
            function(failed_path)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable)
