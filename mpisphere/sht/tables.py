"""Legendre tables of one rank's orders, split by equatorial parity (no MPI).

A table holds, for each of a rank's orders ``m``, the values of a family of
functions ``T(l, m, theta_k)`` for the degrees ``l = start_m, start_m + 1,
..., L - 1`` (zero below ``start_m``). Every family used here has a definite
parity about the equator: ``T(l, m, pi - theta) = (-1)^(l - start_m) T(l, m,
theta)``. So each order's table is split in two and evaluated on the
northern half of the latitudes only: the *even* part (degrees ``start_m,
start_m + 2, ...``, symmetric, over the northern latitudes and the equator)
and the *odd* part (``start_m + 1, ...``, antisymmetric, northern latitudes
only: they vanish on the equator). This halves both the memory and the
arithmetic of the Legendre step. The latitudes must be symmetric about the
equator (every rule of :mod:`mpisphere.quadrature` is).

Families:

* ``scalar_tables``: ``P(l, m)`` in a norm, with the quadrature weights
  folded in for analysis (``start = m``, ``L = lmax``);
* ``vector_tables``: ``P(l, m) / sin(theta)`` (orthonormal) for
  ``m >= 1`` and ``P(l, 1)`` without the Condon-Shortley phase for ``m = 0``
  (``start = 1``), up to degree ``lmax`` (``L = lmax + 1``): the vector
  transforms combine them over neighbouring degrees (see
  :mod:`mpisphere.sht.coupling`).
"""

import math

import numpy

from ..legendre import associated_legendre

__all__ = ["LegendreTables", "scalar_tables", "vector_tables", "first_degrees"]

_CHUNK = 16  # orders per recurrence run: bounds the temporary full table

# An order's functions fall off towards the poles like sin(theta)^m. The polar latitudes where all of an
# order's values lie below this fraction of its largest are skipped by the contraction: they change a
# float64 result by less than 1e-30 of the sum of absolute values its rounding is measured against
NEGLIGIBLE = 1e-30


class LegendreTables:
    """Parity-split tables for one rank's orders.

    Attributes
    ----------
    orders : list of int
        Global orders, in the rank's local order.
    starts : list of int
        First degree of each order's family.
    degrees : int
        ``L``: degrees ``0 .. L - 1``.
    n_north, n_half : int
        Northern latitudes, and those plus the equator (``nlat // 2`` and
        ``(nlat + 1) // 2``).
    even, odd : list of ndarray
        Per order: ``even[j]`` of shape ``(n_even, n_half)`` for degrees
        ``starts[j], starts[j] + 2, ...``; ``odd[j]`` of shape ``(n_odd,
        n_north)`` for ``starts[j] + 1, ...``.
    """

    def __init__(self, degrees, orders, starts, nlat, dtype):
        self.degrees = degrees
        self.orders = list(orders)
        self.starts = list(starts)
        self.n_north = nlat // 2
        self.n_half = self.n_north + nlat % 2
        self.dtype = numpy.dtype(dtype)
        self.even, self.odd = [], []
        self.even_from, self.odd_from = [], []
        self._device = {}

    def _add(self, values, start):
        """Append one order from its ``(L, n_half)`` values on the northern half (and equator)."""
        even = numpy.ascontiguousarray(values[start::2, :], dtype=self.dtype)
        odd = numpy.ascontiguousarray(values[start + 1::2, :self.n_north], dtype=self.dtype)
        largest = float(numpy.abs(values[start:]).max()) if values[start:].size else 0.0
        self.even.append(even)
        self.odd.append(odd)
        self.even_from.append(_first_significant(even, NEGLIGIBLE * largest))
        self.odd_from.append(_first_significant(odd, NEGLIGIBLE * largest))

    def nbytes(self):
        return sum(t.nbytes for t in self.even) + sum(t.nbytes for t in self.odd)

    def multiply_adds(self, columns):
        """Multiply-adds of one contraction of ``columns`` real columns, one per stored entry and column.

        Counts the polar entries the contraction skips (see ``even_from``)
        too, as :func:`mpisphere.sht.costs.table_entries` does: a rate
        measured per this count and the cost model's count agree.
        """
        return columns * sum(t.size for t in self.even + self.odd)

    def padded(self, xp, device_id):
        """Tables stacked and zero-padded to equal shapes, for batched products (cached per device).

        Returns ``(even, odd, (l, j, i)_even, (l, j, i)_odd)``: stacked tables
        of shape ``(count, n, n_lat)`` and the index triples that scatter the
        products' rows ``i`` of order ``j`` to degree ``l``.
        """
        key = (xp.__name__, device_id)
        if key not in self._device:
            count = len(self.orders)
            n_even = max([t.shape[0] for t in self.even] + [0])
            n_odd = max([t.shape[0] for t in self.odd] + [0])
            even = numpy.zeros((count, n_even, self.n_half), self.dtype)
            odd = numpy.zeros((count, n_odd, self.n_north), self.dtype)
            rows_even, rows_odd = [], []
            for j, start in enumerate(self.starts):
                even[j, :self.even[j].shape[0]] = self.even[j]
                odd[j, :self.odd[j].shape[0]] = self.odd[j]
                rows_even += [(start + 2 * i, j, i) for i in range(self.even[j].shape[0])]
                rows_odd += [(start + 1 + 2 * i, j, i) for i in range(self.odd[j].shape[0])]
            index_even = numpy.array(rows_even, dtype=numpy.int64).reshape(-1, 3).T
            index_odd = numpy.array(rows_odd, dtype=numpy.int64).reshape(-1, 3).T
            self._device[key] = tuple(xp.asarray(a) for a in (even, odd)) + \
                (tuple(xp.asarray(a) for a in index_even), tuple(xp.asarray(a) for a in index_odd))
        return self._device[key]


def _first_significant(table, threshold):
    """The first column of ``table`` with an entry above ``threshold`` in magnitude (at most the last column)."""
    if not table.size:
        return 0
    significant = numpy.flatnonzero(numpy.any(numpy.abs(table) > threshold, axis=0))
    return int(significant[0]) if significant.size else table.shape[1] - 1


def _north(theta):
    return theta[:(len(theta) + 1) // 2]


def scalar_tables(lmax, orders, theta, weights, norm, csphase, inverse, dtype):
    """Tables of ``P(l, m)`` (times ``2 pi w_k`` when ``weights`` is given) for ``l < lmax``.

    ``weights`` are the quadrature weights (analysis); ``None`` for synthesis.
    ``inverse`` selects the inverse norm factors (see
    :func:`mpisphere.legendre.degree_factors`).
    """
    orders = list(orders)
    tables = LegendreTables(lmax, orders, orders, len(theta), dtype)
    north = _north(theta)
    scale = None if weights is None else 2.0 * math.pi * weights[:len(north)]
    for first in range(0, len(orders), _CHUNK):
        block = orders[first:first + _CHUNK]
        values = associated_legendre(lmax, block, north, norm, csphase, inverse)
        if scale is not None:
            values *= scale
        for i, m in enumerate(block):
            tables._add(values[i], m)
    return tables


def first_degrees(orders, vector):
    """The first degree of each order's family (``start_m``), an int64 array.

    ``m`` for the scalar functions; for the vector ones ``max(m, 1)``: order
    0's family is ``P(l, 1)``, which starts at degree 1.
    """
    orders = numpy.asarray(orders, dtype=numpy.int64)
    return numpy.maximum(orders, 1) if vector else orders


def vector_tables(lmax, orders, theta, weights, csphase, dtype):
    """Tables for the vector transforms, orthonormal, for degrees ``l <= lmax`` (``L = lmax + 1``).

    Order ``m >= 1``: ``P(l, m) / sin(theta)`` with the Condon-Shortley phase
    when ``csphase`` (start ``m``). Order 0: ``P(l, 1)`` without it (start 1),
    whose multiples are ``d P(l, 0) / d theta``. Times ``2 pi w_k`` when
    ``weights`` is given.
    """
    orders = list(orders)
    starts = first_degrees(orders, vector=True).tolist()
    tables = LegendreTables(lmax + 1, orders, starts, len(theta), dtype)
    north = _north(theta)
    scale = None if weights is None else 2.0 * math.pi * weights[:len(north)]
    for first in range(0, len(orders), _CHUNK):
        block = orders[first:first + _CHUNK]
        positive = [m for m in block if m > 0]
        divided = associated_legendre(lmax + 1, positive, north, "ortho", csphase, divide_by_sin=True) \
            if positive else None
        for m in block:
            if m > 0:
                values = divided[positive.index(m)]
            else:
                values = associated_legendre(lmax + 1, [1], north, "ortho", csphase=False)[0]
            if scale is not None:
                values = values * scale
            tables._add(values, m if m > 0 else 1)
    return tables
