"""How an extent is divided among ranks, and the batch-axis bookkeeping.

Every operator in mpisphere splits an extent ``n`` over ``parts`` ranks with
:func:`~mpisphere.split_sizes`: balanced, the first ``n % parts`` chunks one larger, in
rank order, every chunk non-empty. Because all of them use this one rule,
any two operators agree on who owns what.

Nothing here communicates or keeps state; the functions work on NumPy and
CuPy arrays alike (only slicing, reshaping and concatenation are used).
"""

import math

import numpy

from .validation import check_int

__all__ = [
    "split_sizes",
    "split_offsets",
    "offsets_of",
    "chunk_slice",
    "split_along",
    "normalize_axis",
    "flatten_leading",
    "unflatten_leading",
]


def split_sizes(n, parts):
    """Balanced chunk sizes of ``n`` elements over ``parts`` chunks.

    Parameters
    ----------
    n : int
        Extent to split (latitudes, longitudes, degrees, batch entries).
    parts : int
        Number of chunks, usually a communicator size.

    Returns
    -------
    list of int
        ``parts`` sizes summing to ``n``; the first ``n % parts`` are one
        larger than the rest.

    Raises
    ------
    ValueError
        If ``parts < 1`` or ``n < parts`` (a chunk would be empty).

    Examples
    --------
    >>> split_sizes(10, 4)
    [3, 3, 2, 2]
    """
    n = check_int(n, "n")
    parts = check_int(parts, "parts")
    if parts < 1:
        raise ValueError(f"split_sizes: parts must be at least 1, got parts={parts} (n={n})")
    if n < parts:
        raise ValueError(
            f"split_sizes: cannot split n={n} elements into parts={parts} non-empty chunks; "
            f"use at most {max(n, 0)} parts or a larger extent")
    base, extra = divmod(n, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def split_offsets(n, parts):
    """Start index of every chunk of :func:`~mpisphere.split_sizes` (``parts`` entries)."""
    return offsets_of(split_sizes(n, parts))


def offsets_of(counts):
    """Exclusive prefix sum: where each of ``counts`` consecutive blocks starts."""
    offsets, start = [], 0
    for count in counts:
        offsets.append(start)
        start += count
    return offsets


def chunk_slice(n, parts, index):
    """The ``slice`` of chunk ``index`` of ``n`` elements split over ``parts``."""
    index = check_int(index, "index")
    parts = check_int(parts, "parts")
    if not 0 <= index < parts:
        raise ValueError(f"chunk_slice: index {index} out of range for {parts} parts")
    base, extra = divmod(check_int(n, "n"), parts)
    split_sizes(n, parts)  # validates n >= parts
    start = index * base + min(index, extra)
    return slice(start, start + base + (1 if index < extra else 0))


def normalize_axis(axis, ndim, who="axis"):
    """``axis`` as a non-negative index into ``ndim`` axes (negative counts from the end)."""
    axis = check_int(axis, who)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{who} {axis} is out of range for an array of {ndim} dimensions")
    return axis % ndim


def split_along(x, axis, parts):
    """Split ``x`` along ``axis`` into :func:`~mpisphere.split_sizes` chunks.

    Parameters
    ----------
    x : array
        NumPy or CuPy array, any shape.
    axis : int
        Axis to split; negative values count from the end.
    parts : int
        Number of chunks.

    Returns
    -------
    list of array
        ``parts`` views of ``x`` (no copies), in order.
    """
    axis = normalize_axis(axis, x.ndim, "split_along: axis")
    n = x.shape[axis]
    lead = (slice(None),) * axis
    chunks = []
    start = 0
    for size in split_sizes(n, parts):
        chunks.append(x[lead + (slice(start, start + size),)])
        start += size
    return chunks


def flatten_leading(x, min_size=1, trailing=2):
    """Collapse the leading (batch) axes into one, padding it with zeros if short.

    The distributed transforms split this one batch axis over a communicator,
    so it must hold at least one entry per rank. It is padded only when it is
    shorter than ``min_size``, never rounded up to a multiple.

    Parameters
    ----------
    x : array, shape ``(..., *trailing_shape)``
        Real or complex NumPy/CuPy array.
    min_size : int
        Minimum length of the flattened leading axis.
    trailing : int
        Number of trailing axes kept as they are (2 for ``(nlat, nlon)``).

    Returns
    -------
    flat : array, shape ``(max(m, min_size), *trailing_shape)``
        A view of ``x`` when no padding and no copy are needed.
    lead_shape : tuple of int
        The original leading shape.
    lead_size : int
        ``m``, the number of real (unpadded) entries.
    """
    trailing = check_int(trailing, "trailing")
    if trailing < 0 or x.ndim < trailing:
        raise ValueError(
            f"flatten_leading: array of shape {tuple(x.shape)} has fewer than {trailing} trailing axes")
    split = x.ndim - trailing
    lead_shape = tuple(x.shape[:split])
    tail = tuple(x.shape[split:])
    lead_size = math.prod(lead_shape)
    flat = x.reshape((lead_size,) + tail)
    if lead_size < min_size:
        # NumPy functions dispatch to CuPy for CuPy arrays (NEP 18)
        pad = numpy.zeros_like(flat, shape=(min_size - lead_size,) + tail)
        flat = numpy.concatenate([flat, pad], axis=0)
    return flat, lead_shape, lead_size


def unflatten_leading(y, lead_shape, lead_size, trailing=2):
    """Inverse of :func:`flatten_leading`: drop the padding, restore the leading shape.

    The trailing axes are taken from ``y`` as they are, so this also restores
    the batch shape after a transform changed them (``(nlat, nlon)`` to
    ``(lmax, mmax)``).
    """
    trailing = check_int(trailing, "trailing")
    if y.ndim != trailing + 1:
        raise ValueError(
            f"unflatten_leading: expected {trailing + 1} axes (flat batch + {trailing}), got shape {tuple(y.shape)}")
    if y.shape[0] < lead_size:
        raise ValueError(
            f"unflatten_leading: flat batch axis has {y.shape[0]} entries, fewer than lead_size={lead_size}")
    return y[:lead_size].reshape(tuple(lead_shape) + tuple(y.shape[1:]))

