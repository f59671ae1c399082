"""Roots on network filesystems are polled: inotify never hears what another node writes there."""

from __future__ import annotations

from pathlib import Path

from lossguard.watch.mounts import filesystem, parse_mountinfo, remote_roots

# The shape of /proc/self/mountinfo on a cluster login node (proc(5)): optional fields before " - ",
# spaces in mount points written as \040.
MOUNTINFO = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
25 22 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
61 22 0:52 / /scratch rw,relatime shared:30 - lustre 10.0.0.5@o2ib:/scratch rw,flock
62 22 0:53 / /home rw,relatime shared:31 - nfs4 fs01:/export/home rw,vers=4.2
63 62 0:54 / /home/ana/local\\040disk rw,relatime shared:32 - ext4 /dev/sdb1 rw
64 22 0:55 / /mnt/bucket rw,nosuid,nodev,relatime shared:33 - fuse.gcsfuse my-bucket rw,user_id=0
65 22 0:56 / /data rw,relatime shared:34 - xfs /dev/sdc1 rw
"""


def test_mountinfo_lines_give_mount_point_and_type():
    mounts = parse_mountinfo(MOUNTINFO)
    assert ("/scratch", "lustre") in mounts and ("/home/ana/local disk", "ext4") in mounts
    assert filesystem(Path("/home/ana/local disk/runs"), mounts) == "ext4"  # the deepest mount wins
    assert filesystem(Path("/home/ana/runs"), mounts) == "nfs4"
    assert filesystem(Path("/scratchpad"), mounts) == "ext4"  # a name prefix is not a parent folder


def test_only_roots_on_network_filesystems_are_polled():
    roots = [Path("/scratch/runs"), Path("/home/ana/runs"), Path("/mnt/bucket/exp"), Path("/data/runs"), Path("/home/ana/local disk/x")]
    assert remote_roots(roots, MOUNTINFO) == {Path("/scratch/runs"): "lustre", Path("/home/ana/runs"): "nfs4", Path("/mnt/bucket/exp"): "fuse.gcsfuse"}


def test_this_machines_mountinfo_names_the_filesystem_of_the_root():
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    assert filesystem(Path("/"), mounts)
