"""Which filesystem a watched folder lives on. inotify only reports changes made through this
machine's kernel: on NFS, Lustre, GPFS, CIFS or a FUSE mount, the trainer writing from another node
is invisible to it, and only rescanning sees the run grow. Clusters keep their runs on exactly those,
so the daemon looks the filesystem up instead of relying on the user to pass --polling."""

from __future__ import annotations

import os
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
REMOTE = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p", "afs",
    "panfs", "wekafs", "virtiofs", "davfs", "orangefs", "pvfs2", "ocfs2", "gfs2", "cvfs", "vboxsf",
}


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as \040, \011, \012, \134.
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) for each line of /proc/self/mountinfo."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        mounts.append((_unescape(fields[4]), right.split()[0]))
    return mounts


def filesystem(path: Path, mounts: list[tuple[str, str]]) -> str | None:
    """The type of the filesystem holding `path`: the deepest mount point above it (the last one
    listed wins where mounts are stacked on the same point)."""
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for point, fstype in mounts:
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), fstype)
    return best[1] if best else None


def is_remote(fstype: str | None) -> bool:
    return fstype is not None and (fstype in REMOTE or fstype.startswith("fuse"))


def remote_roots(roots: list[Path], mountinfo: str | None = None) -> dict[Path, str]:
    """The roots inotify cannot watch, with their filesystem type."""
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text()
        except OSError:
            return {}
    mounts = parse_mountinfo(mountinfo)
    found = {}
    for root in roots:
        fstype = filesystem(root, mounts)
        if is_remote(fstype):
            found[root] = fstype
    return found
