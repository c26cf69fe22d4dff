"""Distributed fields and model states to disk and back: one Zarr v3 store that xarray opens.

* :class:`FieldStore`: tiles and coefficient blocks as named variables,
  every rank writing and reading its own share (no rank gathers a field),
  read back onto a grid of any shape; checksummed chunks, CF coordinates.
* :func:`checkpoint` / :func:`open_checkpoint`: versioned checkpoints that a
  crash while writing cannot damage (a new version, then an atomic switch).

Zarr (``pip install '.[io]'``, Python 3.11 or newer) is imported when a
store is opened; ``import mpisphere.io`` needs only mpisphere.

Modules: :mod:`.chunks` (who stores which chunk, no MPI), :mod:`.owners` (the
all-to-all between parts and chunks), :mod:`.variables` (one variable as Zarr
holds it, no MPI), :mod:`.zarr_files`
(the Zarr side), ``store`` (the collective calls), ``checkpoint``
(versions).
"""

from .checkpoint import Checkpoint, checkpoint, open_checkpoint
from .store import FieldStore

__all__ = ["FieldStore", "checkpoint", "open_checkpoint", "Checkpoint"]
