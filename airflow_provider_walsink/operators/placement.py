"""Where the staging root must live for a given Spark master: fail before a cluster job writes
into a directory that only one machine can see.

The write phase's executors write committables under the staging root, the write task
(the Spark driver in client mode) seals the manifest there, and the durability sensor
and the commit task read it back. Under a ``local`` master all of them run on one host;
on a cluster they do not, and a staging root on a local disk silently splits the
attempt across machines: the manifest lists files that the commit task cannot find (or,
worse, finds a stale copy of). So a non-local master needs a staging root that every
executor and every Airflow worker sees at the same path.

:func:`check_staging_placement` accepts the pair when one of these holds, in order:

1. the master runs everything on this host: ``local``, ``local[N]``, ``local[*]``,
   ``local[N,F]``, ``local-cluster[...]``, or a standalone/Mesos master whose every host
   is a loopback address (``spark://127.0.0.1:7077``, ``spark://localhost:7077``), or a
   Spark Connect server on a loopback address (``spark_connect://127.0.0.1:15002``: read as
   such a master, its executors on this host too);
2. the staging root is a URI of a distributed or object store (``hdfs://``, ``s3a://``,
   ``gs://``, ``abfss://``...), anything but ``file:``;
3. the user declared it shared: the walsink connection's extra ``"staging_shared": true``
   (a Docker/Kubernetes volume mounted on every node, a shared disk the mount table
   cannot reveal);
4. the mount table says so: the longest mount point containing the staging root has
   a network or cluster file system type (NFS, CIFS, CephFS, GlusterFS, Lustre, a FUSE
   file system such as s3fs, gcsfuse, JuiceFS...).

Otherwise :class:`StagingPlacementError` says which staging root, which file system and
which master, and how to fix it. Nothing here imports Airflow or Spark.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from airflow_provider_walsink.core.protocol.errors import WalsinkError

#: File system types (``/proc/mounts``' third field) that every node of a cluster can mount.
SHARED_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ocfs2",
        "gfs2",
        "9p",
        "afs",
        "virtiofs",
    }
)
#: FUSE types are ``fuse.<program>``: these programs mount a shared or object store.
SHARED_FUSE_PROGRAMS = frozenset(
    {
        "s3fs",
        "gcsfuse",
        "goofys",
        "juicefs",
        "rclone",
        "sshfs",
        "glusterfs",
        "cephfs",
        "ceph-fuse",
        "mountpoint-s3",
        "alluxio-fuse",
        "blobfuse",
        "blobfuse2",
        "geesefs",
        "hdfs",
    }
)
_LOCAL_MASTER = re.compile(r"^local(\[[^\]]*\])?$|^local-cluster\[[^\]]*\]$")
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class StagingPlacementError(WalsinkError, ValueError):
    """The staging root is on a disk that the Spark master's executors cannot all see."""


def is_local_master(master: str) -> bool:
    """``local``, ``local[...]`` and ``local-cluster[...]``: driver and executors on this host."""
    return bool(_LOCAL_MASTER.match(master.strip()))


def _is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def master_hosts(master: str) -> list[str] | None:
    """Hosts of a ``spark://h1:p1,h2:p2`` or ``mesos://`` master (or a ``spark_connect://`` server,
    read as a standalone master is: its host); ``None`` for yarn, k8s and anything whose executors
    the master URL does not locate."""
    scheme, sep, rest = master.strip().partition("://")
    if not sep or scheme not in ("spark", "mesos", "spark_connect"):
        return None
    hosts = []
    for part in rest.split("/")[0].split(","):
        hostname = urlsplit(f"//{part}").hostname
        if not hostname:
            return None
        hosts.append(hostname)
    return hosts


def is_same_host_master(master: str) -> bool:
    """True when every executor of ``master`` runs on this host (local, or a loopback cluster)."""
    if is_local_master(master):
        return True
    hosts = master_hosts(master)
    return bool(hosts) and all(_is_loopback(h) for h in hosts)


def _unescape_mount(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal (\040...).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def read_mounts(mounts_file: str | os.PathLike[str] = "/proc/mounts") -> list[tuple[str, str]]:
    """``(mount point, file system type)`` pairs of the mount table; empty if it is unreadable."""
    try:
        text = Path(mounts_file).read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            out.append((_unescape_mount(fields[1]), fields[2]))
    return out


def filesystem_of(path: str | os.PathLike[str], mounts: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """The mount (point, type) holding ``path``: the longest mount point containing it.

    The path is resolved first (its nearest existing ancestor, since the staging root
    may not exist yet), so a symlink into a network mount counts as that mount.
    """
    candidate = Path(os.path.abspath(path))
    while not candidate.exists() and candidate != candidate.parent:
        candidate = candidate.parent
    resolved = Path(os.path.realpath(candidate))
    best: tuple[str, str] | None = None
    for point, fstype in mounts:
        mount = Path(point)
        if (resolved == mount or mount in resolved.parents) and (best is None or len(point) > len(best[0])):
            best = (point, fstype)
    return best


def is_shared_fs_type(fstype: str) -> bool:
    if fstype in SHARED_FS_TYPES:
        return True
    kind, _, program = fstype.partition(".")
    return kind == "fuse" and program in SHARED_FUSE_PROGRAMS


def check_staging_placement(
    staging_root: str | os.PathLike[str],
    master: str,
    *,
    shared: bool = False,
    mounts: Iterable[tuple[str, str]] | None = None,
) -> str:
    """Raise :class:`StagingPlacementError` unless executors of ``master`` all see ``staging_root``.

    :param staging_root: the staging root (a path, or a URI).
    :param master: the Spark master URL the write phase is submitted to.
    :param shared: the user's declaration (connection extra ``staging_shared``).
    :param mounts: ``(mount point, fs type)`` pairs; default: ``/proc/mounts``.
    :returns: why the placement is accepted (one line, for the task log).
    :raises StagingPlacementError: the staging root is on a local disk and the master
        is not on this host. Safe to repeat; changes nothing.
    """
    root = os.fspath(staging_root)
    if is_same_host_master(master):
        return f"master {master} runs on this host: any staging root works"
    scheme = urlsplit(root).scheme
    if scheme and scheme != "file" and len(scheme) > 1:  # len > 1: not a Windows drive letter
        return f"staging root {root} is on {scheme}://, reachable from every node"
    if shared:
        return f"staging root {root} is declared shared (connection extra staging_shared)"
    path = urlsplit(root).path if scheme == "file" else root
    mount = filesystem_of(path, read_mounts() if mounts is None else mounts)
    if mount is not None and is_shared_fs_type(mount[1]):
        return f"staging root {root} is on a {mount[1]} mount ({mount[0]})"
    on = f"a local {mount[1]} file system mounted at {mount[0]}" if mount else "a local disk"
    raise StagingPlacementError(
        f"staging root {root} is on {on}, but the Spark master {master} is not local: executors on "
        "other hosts would stage files that the commit task never sees. Put the staging root on a file "
        "system every node mounts at the same path (NFS, CephFS, a shared volume...) or on HDFS/an object "
        'store, and if the mount table cannot tell, declare it with the walsink connection extra "staging_shared": true'
    )


def check_operator_placement(operator: object, hook: object, staging_root: str | os.PathLike[str]) -> str:
    """:func:`check_staging_placement` for a ``WalWriteOperator`` about to run (Airflow side).

    The master is the operator's ``master`` when it names no Spark connection, else the
    connection's, resolved as the Spark provider's ``SparkSubmitHook`` resolves it; the
    ``staging_shared`` declaration is read from the operator's walsink connection (absent
    connection: the embedded default, a local directory).
    """
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    spark_conn_id = getattr(operator, "spark_conn_id", None)
    if spark_conn_id is None:
        master = str(getattr(operator, "master", "local[*]"))
    else:
        master = spark_master_of(BaseHook.get_connection(spark_conn_id))
    try:
        extra = BaseHook.get_connection(hook.walsink_conn_id).extra_dejson  # type: ignore[attr-defined]
    except AirflowNotFoundException:
        extra = {}
    return check_staging_placement(staging_root, master, shared=_truthy(extra.get("staging_shared")))


def spark_master_of(conn: object) -> str:
    """The master URL of an Airflow Spark connection, as ``SparkSubmitHook`` builds it."""
    conn_type = getattr(conn, "conn_type", None) or ""
    host = getattr(conn, "host", None) or ""
    port = getattr(conn, "port", None)
    if conn_type == "spark" and host and ("://" in host or not port):
        master = host
    else:
        master = f"{conn_type}://{host}"
    return f"{master}:{port}" if port else master


def _truthy(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)
