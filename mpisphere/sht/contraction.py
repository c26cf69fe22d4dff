"""The Legendre step of a transform on one rank's orders: matrix products over parity-split tables (no MPI).

Fourier and spectral data are held with the latitude or degree axis first,
the order axis second and all batch columns (vector components included)
innermost and contiguous: ``fourier[k, j, :]`` and ``spectral[l, j, :]`` are
the ``K`` real columns of order ``j`` at latitude ``k`` or degree ``l``
(complex data as pairs of reals: the tables are real, so one real product
handles both parts).

``analyze``: ``spectral[l, j] = sum_k T_j[l, k] w_k fourier[k, j]`` (the
forward contraction of a table ``T``, with optional latitude weights ``w``);
``synthesize`` is its transpose, ``fourier[k, j] = w_k sum_l T_j[l, k]
spectral[l, j]``. The weights (the quadrature's, symmetric about the equator)
are applied to each order's parity-split slice while it is in cache, so one
unweighted table serves an analysis and a synthesis (the transforms of a grid
share it).

Two methods: ``per-order`` (one matrix product per order and parity, each
on a slice that stays in cache: NumPy's default; it leaves out the polar
latitudes where an order's functions are negligible, see
``mpisphere.sht.tables.LegendreTables`` ``even_from``) and ``batched``
(one batched product over zero-padded tables: CuPy's default, one kernel
instead of hundreds).
"""

import numpy

from .. import backend, dtypes
from ..stages.pipeline import BATCH_INNERMOST

__all__ = ["METHODS", "BATCH_INNERMOST", "holds_columns", "columns_of", "real_columns", "columns_or_copy",
           "analyze", "synthesize", "copy_degrees", "degrees_are_triangular"]

METHODS = ("auto", "per-order", "batched")



def holds_columns(phys):
    """Whether ``phys``, an ``(n, m, C, B)`` view (``a.transpose(BATCH_INNERMOST)``), is held batch-innermost.

    Each row's orders, components and batch must be contiguous; the rows
    (latitudes or degrees) may be further apart (a view of a wider buffer).
    """
    _, m, c, b = phys.shape
    item = phys.itemsize
    return bool((phys.strides[3] == item or b == 1) and (phys.strides[2] == b * item or c == 1)
                and (phys.strides[1] == c * b * item or m == 1))


def columns_of(a):
    """``a`` (logical ``(B, C, n, m)`` complex) as real ``(n, m, 2 C B)`` columns, or None if not held so.

    The rows (latitudes or degrees) may be further apart than one row (a
    view of a wider buffer); the columns of an order must be contiguous.
    """
    phys = a.transpose(BATCH_INNERMOST)
    return real_columns(phys) if holds_columns(phys) else None


def real_columns(phys):
    """A ``(n, m, C, B)`` complex array with contiguous columns as real ``(n, m, 2 C B)``."""
    return phys.reshape(phys.shape[0], phys.shape[1], -1).view(dtypes.real_of(phys.dtype))


def columns_or_copy(a, workspace, name, copy_in):
    """``a`` as real columns (:func:`columns_of`), and the scratch buffer used for that (or None).

    A view when ``a`` is held batch-innermost; otherwise a buffer of that
    layout from ``workspace`` (holding a copy of ``a`` when ``copy_in``),
    which the caller copies back when it is an output.
    """
    columns = columns_of(a)
    if columns is not None:
        return columns, None
    phys = a.transpose(BATCH_INNERMOST)
    staged = workspace.scratch(name, a, a.size).reshape(phys.shape)
    if copy_in:
        backend.copy_into(staged, phys)
    return real_columns(staged), staged


def _batched(method, like):
    return method == "batched" or (method == "auto" and backend.device_kernels(like))


def _device_id(a):
    return a.device.id if backend.is_device_array(a) else None


def _scratch(workspace, name, like, shape):
    count = 1
    for extent in shape:
        count *= extent
    return workspace.scratch(name, like, count).reshape(shape)


def _weights(weights, t, like):
    """``(w_half, w_north)`` as ``(n, 1)`` columns in ``like``'s module, or ``(None, None)``."""
    if weights is None:
        return None, None
    w = weights if not backend.is_device_array(like) else backend.array_module(like).asarray(weights)
    return w[:t.n_half, None], w[:t.n_north, None]


def degrees_are_triangular(tables):
    """Whether the orders' first degrees increase, so that degree ``l`` is held by a leading run of orders.

    True for the contiguous order layout, and for any layout on one azimuth rank.
    """
    return bool(numpy.all(numpy.diff(numpy.asarray(tables.starts)) >= 0))


def copy_degrees(tables, src, dst, zero=True):
    """``dst[..., l, j] = src[..., l, j]`` where order ``j`` has degree ``l`` (``l >= starts[j]``), else 0.

    ``src`` and ``dst``: logical ``(..., L, m_loc)`` arrays, any two memory
    layouts (a transposed copy, one degree row at a time: each row is a
    small transpose that stays in cache). With ``zero=False`` the entries
    below an order's first degree are left as they are (a contraction
    ignores them). Only half of a triangular truncation is copied: the
    layout changes of a transform on one rank cost half a copy.

    Needs the orders' first degrees in increasing order (see
    :func:`degrees_are_triangular`).
    """
    if not degrees_are_triangular(tables):
        raise ValueError("copy_degrees: the orders' first degrees must increase")
    counts = numpy.searchsorted(tables.starts, numpy.arange(src.shape[-2]), side="right").tolist()
    for l, n in enumerate(counts):
        if n:
            dst[..., l, :n] = src[..., l, :n]
        if zero and n < dst.shape[-1]:
            dst[..., l, n:] = 0


def analyze(tables, fourier, spectral, workspace, method="auto", weights=None, zero=True):
    """``spectral = T diag(w) fourier`` per order; real views ``(n, m_loc, K)``, spectral with ``tables.degrees`` rows.

    ``weights``: ``(nlat,)`` latitude weights (symmetric), or ``None``.
    ``zero=False``: the entries below each order's first degree are not
    written (the caller copies out with :func:`copy_degrees`).
    """
    t = tables
    w_half, w_north = _weights(weights, t, fourier)
    if _batched(method, fourier):
        sym, anti = _parity_split(t, fourier, workspace)
        if w_half is not None:
            sym *= w_half[:, :, None]
            anti *= w_north[:, :, None]
        _analyze_batched(t, sym, anti, spectral)
        return
    n_north, n_half = t.n_north, t.n_half
    rows, columns = fourier.shape[0], fourier.shape[2]
    # per order: the parity split of one (nlat, K) slice, small enough to stay in cache
    sym = _scratch(workspace, "sym", fourier, (n_half, columns))
    anti = _scratch(workspace, "anti", fourier, (n_north, columns))
    for j, start in enumerate(t.starts):
        even, odd = t.even[j], t.odd[j]
        if not even.shape[0]:
            if zero:
                spectral[:t.degrees, j] = 0
            continue
        # the polar latitudes where the order's functions are negligible take no part (tables.NEGLIGIBLE)
        k_even, k_odd = t.even_from[j], t.odd_from[j]
        first = min(k_even, k_odd) if odd.shape[0] else min(k_even, n_north)
        # the whole input column is read before any of the output column is written: spectral may be
        # fourier's memory (the pipeline runs this stage in place)
        column = fourier[:, j]
        north, south = column[first:n_north], column[rows - n_north:rows - first][::-1]
        numpy.add(north, south, out=sym[first:n_north])
        if n_half > n_north:
            sym[n_north] = column[n_north]
        if odd.shape[0]:
            numpy.subtract(north, south, out=anti[first:])
        if w_half is not None:
            sym[k_even:] *= w_half[k_even:]
        if zero:
            spectral[:min(start, t.degrees), j] = 0
        numpy.matmul(even[:, k_even:], sym[k_even:], out=spectral[start::2, j][:even.shape[0]])
        if odd.shape[0]:
            if w_north is not None:
                anti[k_odd:] *= w_north[k_odd:]
            numpy.matmul(odd[:, k_odd:], anti[k_odd:], out=spectral[start + 1::2, j][:odd.shape[0]])


def _parity_split(t, fourier, workspace):
    n_north, n_half = t.n_north, t.n_half
    rows = fourier.shape[0]
    sym = _scratch(workspace, "sym", fourier, (n_half,) + fourier.shape[1:])
    anti = _scratch(workspace, "anti", fourier, (n_north,) + fourier.shape[1:])
    south = fourier[rows - n_north:][::-1]
    numpy.add(fourier[:n_north], south, out=sym[:n_north])
    if n_half > n_north:
        sym[n_north] = fourier[n_north]
    numpy.subtract(fourier[:n_north], south, out=anti)
    return sym, anti


def _analyze_batched(t, sym, anti, spectral):
    xp = backend.array_module(spectral)
    even, odd, (l_e, j_e, i_e), (l_o, j_o, i_o) = t.padded(xp, _device_id(spectral))
    spectral[...] = 0
    if even.shape[1]:
        spectral[l_e, j_e] = xp.matmul(even, sym.transpose(1, 0, 2))[j_e, i_e]
    if odd.shape[1]:
        spectral[l_o, j_o] = xp.matmul(odd, anti.transpose(1, 0, 2))[j_o, i_o]


def synthesize(tables, spectral, fourier, workspace, method="auto", weights=None):
    """``fourier = diag(w) T^T spectral`` per order (the transpose of :func:`analyze`)."""
    t = tables
    n_north, n_half = t.n_north, t.n_half
    rows = fourier.shape[0]
    w_half, w_north = _weights(weights, t, spectral)
    if _batched(method, spectral):
        even_part = _scratch(workspace, "sym", fourier, (n_half,) + fourier.shape[1:])
        odd_part = _scratch(workspace, "anti", fourier, (n_north,) + fourier.shape[1:])
        _synthesize_batched(t, spectral, even_part, odd_part)
        if w_half is not None:
            even_part *= w_half[:, :, None]
            odd_part *= w_north[:, :, None]
        numpy.add(even_part[:n_north], odd_part, out=fourier[:n_north])
        numpy.subtract(even_part[:n_north], odd_part, out=fourier[rows - n_north:][::-1])
        if n_half > n_north:
            fourier[n_north] = even_part[n_north]
        return
    # per order: both parity parts of one (nlat, K) slice stay in cache until combined
    columns = fourier.shape[2]
    even_part = _scratch(workspace, "sym", fourier, (n_half, columns))
    odd_part = _scratch(workspace, "anti", fourier, (n_north, columns))
    for j, start in enumerate(t.starts):
        even, odd = t.even[j], t.odd[j]
        column = fourier[:, j]
        if not even.shape[0]:
            column[...] = 0
            continue
        # the polar latitudes where the order's functions are negligible get zero (tables.NEGLIGIBLE)
        k_even, k_odd = t.even_from[j], t.odd_from[j]
        even_part[:k_even] = 0
        numpy.matmul(even[:, k_even:].T, spectral[start::2, j][:even.shape[0]], out=even_part[k_even:])
        if w_half is not None:
            even_part[k_even:] *= w_half[k_even:]
        north, south = column[:n_north], column[rows - n_north:][::-1]
        if odd.shape[0]:
            odd_part[:k_odd] = 0
            numpy.matmul(odd[:, k_odd:].T, spectral[start + 1::2, j][:odd.shape[0]], out=odd_part[k_odd:])
            if w_north is not None:
                odd_part[k_odd:] *= w_north[k_odd:]
            numpy.add(even_part[:n_north], odd_part, out=north)
            numpy.subtract(even_part[:n_north], odd_part, out=south)
        else:
            north[...] = even_part[:n_north]
            south[...] = even_part[:n_north]
        if n_half > n_north:
            column[n_north] = even_part[n_north]


def _synthesize_batched(t, spectral, even_part, odd_part):
    xp = backend.array_module(spectral)
    even, odd, (l_e, j_e, i_e), (l_o, j_o, i_o) = t.padded(xp, _device_id(spectral))
    count, columns = spectral.shape[1], spectral.shape[2]
    if even.shape[1]:
        gathered = xp.zeros((count, even.shape[1], columns), spectral.dtype)
        gathered[j_e, i_e] = spectral[l_e, j_e]
        even_part[...] = xp.matmul(even.transpose(0, 2, 1), gathered).transpose(1, 0, 2)
    else:
        even_part[...] = 0
    if odd.shape[1]:
        gathered = xp.zeros((count, odd.shape[1], columns), spectral.dtype)
        gathered[j_o, i_o] = spectral[l_o, j_o]
        odd_part[...] = xp.matmul(odd.transpose(0, 2, 1), gathered).transpose(1, 0, 2)
    else:
        odd_part[...] = 0
