"""Which spherical-harmonic orders each azimuth rank holds (no MPI).

With triangular truncation order ``m`` carries the degrees ``m .. lmax - 1``:
its Legendre tables and its share of the contraction are proportional to
``lmax - m``. Two layouts:

``"contiguous"`` (the default, torch-harmonics' layout)
    rank ``r`` holds the ``r``-th :func:`~mpisphere.split_sizes` chunk of
    ``0 .. mmax - 1``. Simple to index, but the first rank holds the heavy
    low orders: about 75% of the work at two ranks, close to twice the mean
    as the ranks grow.
``"balanced"``
    the orders, heaviest first, each go to the rank with the least work so
    far among those that still have room, the room being the same
    ``split_sizes`` counts as in the contiguous layout (so blocks keep their
    shapes and the transposes their chunk sizes). For work falling linearly
    in ``m`` this is ecTrans' zig-zag (``0, 1, .., P-1, P-1, .., 1, 0,
    0, 1, ..``); each rank's orders are kept in increasing order.

Both are functions of ``(mmax, lmax, parts)`` only, so the scalar and vector
transforms of one grid hold the same orders and their blocks combine.
"""

import heapq

import numpy

from ..partition import split_offsets, split_sizes
from ..validation import check_choice, check_int

__all__ = ["ORDER_LAYOUTS", "order_assignment", "order_weights"]

ORDER_LAYOUTS = ("contiguous", "balanced")


def order_weights(mmax, lmax):
    """The work per order, up to a constant: ``lmax - m`` degrees (at least 1), shape ``(mmax,)``."""
    return numpy.maximum(lmax - numpy.arange(mmax), 1)


def order_assignment(mmax, lmax, parts, layout="contiguous"):
    """The global orders of each of ``parts`` azimuth ranks.

    Parameters
    ----------
    mmax, lmax : int
        Orders and degrees of the transform (``mmax >= parts``).
    parts : int
        Azimuth ranks.
    layout : {"contiguous", "balanced"}

    Returns
    -------
    list of ``parts`` int64 arrays, increasing: rank ``r`` holds
    ``split_sizes(mmax, parts)[r]`` orders, together every order once.
    """
    mmax = check_int(mmax, "mmax", "order_assignment", minimum=1)
    lmax = check_int(lmax, "lmax", "order_assignment", minimum=1)
    parts = check_int(parts, "parts", "order_assignment", minimum=1)
    check_choice(layout, ORDER_LAYOUTS, "orders")
    sizes = split_sizes(mmax, parts)
    if layout == "contiguous" or parts == 1:
        return [numpy.arange(start, start + n, dtype=numpy.int64)
                for start, n in zip(split_offsets(mmax, parts), sizes)]
    weights = order_weights(mmax, lmax)
    held = [[] for _ in range(parts)]
    heap = [(0, r) for r in range(parts)]  # (work so far, rank): the lightest rank with room pops first
    for m in numpy.argsort(-weights, kind="stable"):
        work, r = heapq.heappop(heap)
        held[r].append(int(m))
        if len(held[r]) < sizes[r]:
            heapq.heappush(heap, (work + int(weights[m]), r))
    return [numpy.array(sorted(h), dtype=numpy.int64) for h in held]


def order_permutation(assignment):
    """The orders of every rank in rank order: the column permutation before the order transpose."""
    return numpy.concatenate(assignment)
