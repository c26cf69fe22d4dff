"""The Zarr v3 side of a store: the import, the codecs, arrays and their chunk files (no MPI).

Zarr is imported when a store is opened, never at ``import mpisphere``:
it is an optional dependency (the ``io`` extra; Zarr 3 needs Python 3.11).
Every chunk is stored raw (little-endian bytes) followed by its CRC-32C
(Zarr's ``crc32c`` codec), which Zarr checks on every read, xarray's reads
included: a flipped bit or a truncated chunk raises instead of returning
wrong numbers. A chunk file that is missing reads in Zarr as the fill
value, silently; ``missing_chunks`` is the check that catches it.
"""

import contextlib
import json
import os
import warnings

__all__ = ["import_zarr", "create_array", "open_array", "open_group", "chunk_files", "missing_chunks", "sync_files",
           "consolidate", "write_text_atomically", "json_safe", "INSTALL_HINT"]

INSTALL_HINT = ("mpisphere.io needs zarr>=3 (Python 3.11 or newer): pip install '.[io]' in the "
                "mpisphere clone")


def import_zarr():
    """The ``zarr`` module (version 3 or newer); ImportError with the install line otherwise."""
    try:
        import zarr
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT}: {exc}") from None
    if int(zarr.__version__.split(".")[0]) < 3:
        raise ImportError(f"{INSTALL_HINT}: found zarr {zarr.__version__}")
    return zarr


def open_group(path, mode):
    """The root group of the store at ``path`` (a directory), Zarr format 3."""
    zarr = import_zarr()
    if mode == "r" and not os.path.isdir(path):
        raise FileNotFoundError(f"no store at {path!r}")
    # never the consolidated metadata: it is a snapshot for readers such as xarray, rewritten after each write
    return zarr.open_group(path, mode=mode, zarr_format=3, use_consolidated=False)


def create_array(group, name, shape, chunks, dtype, dims, attrs):
    """A new array (replacing one of the same name) with checksummed raw chunks; metadata only."""
    import_zarr()
    from zarr.codecs import BytesCodec, Crc32cCodec
    return group.create_array(name, shape=tuple(shape), chunks=tuple(chunks), dtype=dtype, fill_value=0,
                              serializer=BytesCodec(), compressors=[Crc32cCodec()], dimension_names=tuple(dims),
                              attributes=attrs, overwrite=True,
                              config={"write_empty_chunks": True})


def open_array(path, name):
    """The array ``name`` of the store at ``path``."""
    zarr = import_zarr()
    if not os.path.isfile(os.path.join(path, name, "zarr.json")):
        raise KeyError(name)
    # the configuration is not stored with the array: a chunk of zeros must still be written (a missing
    # chunk file reads as the fill value, and mpisphere.io takes a missing file for a damaged store)
    return zarr.open_array(os.path.join(path, name), mode="r+", zarr_format=3).with_config(
        {"write_empty_chunks": True})


def chunk_files(path, name, array, selections):
    """``(key, file path)`` of every chunk under ``selections`` (whole chunks, one index per leading axis)."""
    chunks = array.chunks
    for sel in selections:
        ranges = []
        for i, c, n in zip(sel, chunks, array.shape):
            start, stop, _ = (i, i + 1, 1) if isinstance(i, int) else i.indices(n)
            ranges.append(range(start // c, -(-stop // c)))
        for coords in _product(ranges):
            key = array.metadata.encode_chunk_key(coords)
            yield key, os.path.join(path, name, *key.split("/"))


def missing_chunks(path, name, array, selections):
    """The chunk keys under ``selections`` with no file (Zarr would read them as the fill value)."""
    return [key for key, file in chunk_files(path, name, array, selections) if not os.path.isfile(file)]


def sync_files(files):
    """``fsync`` each file and the folders that hold them: on the disk, not only in the page cache."""
    folders = set()
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        folders.add(os.path.dirname(file))
    for folder in sorted(folders):
        with contextlib.suppress(OSError):  # not every filesystem lets a directory be opened for fsync
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _product(ranges):
    if not ranges:
        yield ()
        return
    for i in ranges[0]:
        for rest in _product(ranges[1:]):
            yield (i,) + rest


def consolidate(path):
    """Write the store's consolidated metadata (what ``xarray.open_zarr`` reads first) and sync the root."""
    zarr = import_zarr()
    with warnings.catch_warnings():
        # consolidated metadata is a Zarr-Python extension of the v3 format; xarray reads it and wants it
        warnings.filterwarnings("ignore", message="Consolidated metadata")
        zarr.consolidate_metadata(path)


def write_text_atomically(path, text):
    """Replace the file ``path`` by ``text`` so that a reader sees the old or the new content, never a part."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    sync_files([path])


def json_safe(value, what):
    """``value`` if it is JSON (what Zarr attributes hold); TypeError naming ``what`` otherwise."""
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON (numbers, strings, lists, dicts): {exc}") from None
    return value
