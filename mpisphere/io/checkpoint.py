"""Checkpoints that survive a crash while they are written: a new version per save, then an atomic switch.

A checkpoint is a directory::

    path/
        CURRENT          the name of the last complete version (replaced atomically)
        v000007.zarr/    a FieldStore: the variables and the state's attributes
        v000008.zarr/

:func:`~mpisphere.io.checkpoint` opens a new version, the caller writes into it, and when
the ``with`` block ends on every rank without an error the version is
marked complete and ``CURRENT`` is switched to it (written to a temporary
file, synced, renamed over the old one). A crash at any moment before the
rename leaves ``CURRENT`` naming the previous version, which is untouched;
the unfinished version is removed by the next save. The oldest versions
beyond ``keep`` are removed after a switch. Every file of a version is
synced to the disk (``fsync``) before the switch, so the version
``CURRENT`` names survives a node that loses power too.
"""

import os
import re
import shutil

from ..agreement import Call, collective
from ..validation import check_int
from . import zarr_files
from .store import FieldStore

__all__ = ["checkpoint", "open_checkpoint", "Checkpoint"]

_VERSION = re.compile(r"^v(\d{6,})\.zarr$")


def _versions(path):
    found = []
    for entry in os.listdir(path) if os.path.isdir(path) else ():
        match = _VERSION.match(entry)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _complete(version_path):
    """Whether a version was marked complete (an unfinished one, left by a crash, is not)."""
    try:
        group = zarr_files.open_group(version_path, "r")
        return bool(group.attrs.get("mpisphere_checkpoint", {}).get("complete"))
    except Exception:  # noqa: BLE001 -- a version that cannot be opened is not complete
        return False


def _current(path):
    """The name of the current version, from ``path/CURRENT``; FileNotFoundError without one."""
    pointer = os.path.join(path, "CURRENT")
    if not os.path.isfile(pointer):
        raise FileNotFoundError(f"no checkpoint at {path!r} (no {pointer!r})")
    with open(pointer) as f:
        name = f.read().strip()
    if not _VERSION.match(name):
        raise ValueError(f"{pointer!r} is damaged: it holds {name[:40]!r}, not a version name")
    return name


class Checkpoint:
    """A checkpoint being written: use :func:`~mpisphere.io.checkpoint`, which returns one.

    ``with checkpoint(path, grid) as store:`` gives the new version's
    :class:`FieldStore` (mode ``"w"``); ``store.set_attrs`` records the
    scalars of a state. Collective over ``grid.cart``.
    """

    def __init__(self, path, grid, keep=2):
        self.path = os.fspath(path)
        self.grid = grid
        self.keep = keep
        self.version = None
        self.store = None

    @collective
    def __enter__(self):
        call = Call(self.grid.cart, f"checkpoint({self.path!r})")
        with call.local():
            self.keep = check_int(self.keep, "keep", "checkpoint", minimum=1)
        call.agree(path=self.path, keep=self.keep)  # rank 0 removes the old versions: one keep for all

        def new_version():
            os.makedirs(self.path, exist_ok=True)
            versions = _versions(self.path)
            return f"v{(versions[-1][0] + 1) if versions else 1:06d}.zarr"
        self.version = call.root(new_version, f"cannot create {self.path!r}")
        self.store = FieldStore(os.path.join(self.path, self.version), self.grid, mode="w", durable=True)
        return self.store

    @collective
    def __exit__(self, kind, exc, tb):
        call = Call(self.grid.cart, f"checkpoint({self.path!r})")
        if getattr(exc, "mpisphere_agreed", False):
            # every rank raised in one agreement inside the block (a rank's failure met the others' next
            # step there): every rank leaves without a step of its own, so none waits for another here
            return False
        # a failure on this rank alone inside the block: the others are in their next step (a write's agreement,
        # or this one); this agreement meets it, every rank raises and no rank switches
        if exc is not None:
            call.fail(f"the checkpoint was not completed: {type(exc).__name__}: {exc}", RuntimeError)
        try:
            call.agree()
        except Exception:
            if exc is not None:
                return False  # this rank's own exception goes on
            raise
        call.root(self._switch, f"cannot switch {self.path!r} to {self.version}")
        return False

    def _switch(self):
        """Rank 0: mark the version complete, point ``CURRENT`` at it, remove old and unfinished versions."""
        group = zarr_files.open_group(os.path.join(self.path, self.version), "r+")
        group.attrs["mpisphere_checkpoint"] = {"complete": True, "version": self.version}
        zarr_files.consolidate(os.path.join(self.path, self.version))
        zarr_files.sync_files([os.path.join(self.path, self.version, "zarr.json")])
        zarr_files.write_text_atomically(os.path.join(self.path, "CURRENT"), self.version + "\n")
        versions = _versions(self.path)
        number = int(_VERSION.match(self.version).group(1))
        kept = [v for v in versions if v[0] <= number and _complete(os.path.join(self.path, v[1]))][-self.keep:]
        for v in versions:
            if v not in kept:
                shutil.rmtree(os.path.join(self.path, v[1]), ignore_errors=True)


def checkpoint(path, grid, keep=2):
    """Write a new checkpoint version at ``path``: ``with checkpoint(path, grid) as store: ...``. Collective.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint's directory (created when missing), seen by every
        rank.
    grid : ProcessGrid
    keep : int
        Complete versions to keep (the newest); 2 by default, so that a
        damaged newest version leaves one to go back to by hand.

    Returns
    -------
    Checkpoint
        A context manager; ``as`` gives a :class:`FieldStore` on the new
        version. The version becomes the current one when the block ends
        without an error on any rank; otherwise every rank raises and the
        previous version stays current.
    """
    return Checkpoint(path, grid, keep)


def open_checkpoint(path, grid):
    """The current version of the checkpoint at ``path`` as a read-only :class:`FieldStore`. Collective.

    Raises on every rank when there is no checkpoint, when ``CURRENT`` is
    damaged, or when the version it names is not marked complete.
    """
    path = os.fspath(path)
    with grid.holding("open_checkpoint"):
        call = Call(grid.cart, f"open_checkpoint({path!r})")
        call.agree(path=path)
        name = call.root(lambda: _current(path))
        store = FieldStore(os.path.join(path, name), grid, mode="r")
        marker = store.attrs().get("mpisphere_checkpoint", {})
        if not marker.get("complete"):
            call.fail(f"{name} is not marked complete")
        call.agree()  # the same verdict everywhere (every rank read the same attributes)
    return store
