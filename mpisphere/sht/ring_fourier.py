"""The Fourier side of a transform on a ring grid: whole rings from the azimuth ranks, one real FFT per ring length.

On a ring grid the azimuth transpose, the real FFT and the truncation of a
regular transform's analysis become two stages: ``ring_transpose``, a
:class:`~mpisphere.Transpose` over ``grid.azimuth`` that gives every rank
whole rings for its chunk of the batch (the points axis gathered with each
azimuth rank's own count of points, the batch split), and ``RingFourier``,
a stage that does not communicate. Its analysis ``forward`` maps the
gathered points ``(B_a, C, npoints_whole)`` (azimuth rank after azimuth
rank, as the transpose lays them) to the orders of this rank's rings,
``(B_a, C, h, mmax)``, complex:

1. the points are put ring after ring (one ``take``);
2. the rings of equal length are taken together, one batched real FFT per
   length (``rfft / nlon_j``);
3. each order ``m < mmax`` reads the frequency it aliases to on a ring of
   ``n`` points: ``m mod n``, or the conjugate of ``n - (m mod n)`` past the
   ring's Nyquist frequency, times ``exp(-i m phi0_j)``.

The synthesis ``forward`` is the reverse: each order's term
``c exp(i m phi) + conj`` is added onto the frequency it aliases to (twice
onto the real frequencies 0 and ``n / 2``), so the ring holds the exact
values of the band-limited field at its points, as ducc0's synthesis does;
then one unnormalised inverse FFT per length, the points put back azimuth
rank after azimuth rank, and the transpose's adjoint. Both adjoints are the
steps' adjoints in reverse.

Why aliasing rather than zeroing the orders a ring cannot resolve: the
synthesis must give the field's values at the points (zeroing them would
give another field, off by the dropped terms wherever they are not
negligible), and the analysis is then the exact quadrature
``sum_j 2 pi w_j / nlon_j sum_k x_jk conj(Y_lm)``, the weighted adjoint of
that synthesis. On grids built for their truncation (octahedral, classic
reduced) the aliased terms are small: the polar rings are short where
``P_l^m`` is tiny.
"""

import numpy

from .. import backend, dtypes
from ..operators import FORWARD, InputError
from ..partition import offsets_of, split_offsets, split_sizes
from ..transpose import Transpose
from ..stages.fourier import FourierStage
from ..stages.pipeline import LocalStage

__all__ = ["RingFourier", "aliased_frequency", "ring_transpose"]


def ring_transpose(tiles, batch):
    """The azimuth transpose of a ring grid: ``(B, C, npoints)`` -> ``(B_a, C, npoints_whole)``, whole rings.

    The batch is split over ``grid.azimuth`` (``split_sizes``), the points
    gathered: every azimuth rank's points of this rank's rings, azimuth rank
    after azimuth rank (``RingFourier`` puts them ring after ring).
    """
    grid = tiles.grid
    row = grid.polar_rank * grid.nazimuth  # the ranks of this polar row hold the same rings (grid ranks: polar-major)
    points = tuple(tiles.local_shape(row + q)[0] for q in range(grid.nazimuth))
    return Transpose(grid.azimuth, axes=(0, 2), extents=(batch, points))


def aliased_frequency(n, mmax):
    """Where orders ``0 .. mmax - 1`` land on a real ring of ``n`` points: ``(q, conjugated)``, two arrays.

    Order ``m`` lands on frequency ``r = m mod n`` of the ring's complex
    spectrum; past the Nyquist frequency (``r > n / 2``) a real ring holds it
    as the conjugate of frequency ``q = n - r`` of its ``n // 2 + 1``.
    """
    r = numpy.arange(mmax) % n
    past = r > n // 2
    return numpy.where(past, n - r, r), past


class _Run:
    """Rings of one length at evenly spaced places: one batched FFT over a strided view of the row.

    ``rows``: a slice of this rank's rings (the orders' axis); ``offset``,
    ``spacing``: where the first ring starts in a ring-major row of this
    rank's whole rings, and how far apart the rings start.
    """

    def __init__(self, rows, offset, spacing, count):
        self.rows, self.offset, self.spacing, self.count = rows, offset, spacing, count

    def rings(self, whole, n):
        """The run's rings, ``(rows, count, n)``, a view of ``whole`` ``(rows, row length)``."""
        item = whole.itemsize
        shape, strides = (whole.shape[0], self.count, n), (whole.strides[0], self.spacing * item, item)
        if isinstance(whole, numpy.ndarray):  # the constructor: a few times faster than as_strided's Python
            return numpy.ndarray(shape, whole.dtype, whole, self.offset * item, strides)
        return backend.as_strided(whole[:, self.offset:], shape, strides)


class _Group:
    """This rank's rings of one length: their runs, FFT, how orders alias onto them, phases and factors."""

    def __init__(self, n, rows, starts, mmax, phi0, real, complex_, synthesis, layout, fft):
        self.n, self.half = n, n // 2 + 1
        self.runs = []
        i = 0
        while i < len(rows):  # the longest runs of evenly spaced rings (a hemisphere's pair, a regular grid)
            j = i + 1
            if j < len(rows):
                row_step, spacing = rows[j] - rows[i], starts[j] - starts[i]
                while j + 1 < len(rows) and rows[j + 1] - rows[j] == row_step and starts[j + 1] - starts[j] == spacing:
                    j += 1
                j += 1
            else:
                row_step, spacing = 1, n
            self.runs.append((_Run(slice(int(rows[i]), int(rows[j - 1]) + 1, int(row_step)), int(starts[i]),
                                   int(spacing), j - i), numpy.arange(i, j)))
            i = j
        self.fourier = FourierStage(n, real, synthesis, layout, fft)
        self.aliased = mmax > self.half  # some orders lie past this ring's Nyquist frequency
        self.wraps = -(-mmax // n)       # how many times the orders go round the ring's n frequencies
        self.index = numpy.arange(mmax) % n
        # twice the terms that land on a real frequency (0, and n / 2 for even n), except m = 0 itself
        q, _ = aliased_frequency(n, mmax)
        factor = numpy.where((q == 0) | ((n % 2 == 0) & (q == n // 2)), 2.0, 1.0).astype(real)
        factor[0] = 1.0
        self.factor = factor
        orders = numpy.arange(mmax)
        self.phases = None if not numpy.any(phi0) else [
            numpy.exp(1j * numpy.outer(phi0[members], orders)).astype(complex_) for _, members in self.runs]


class RingFourier(LocalStage):
    """Whole rings to their orders (analysis) or back (synthesis), after (before) :func:`ring_transpose`.

    Parameters
    ----------
    tiles : RingTiles
        Which points each rank holds.
    batch, components : int
        The pipeline's batch (at least ``grid.nazimuth``) and components (1 or 2).
    mmax : int
        Orders.
    dtype : numpy.dtype
        Real dtype of the fields.
    synthesis : bool
        ``False``: ``forward`` is points -> orders (``rfft / nlon_j``, aliased);
        ``True``: orders -> points (the field's values at the points).
    layout : Layout
        The transform's layout (``grid.cart``).
    fft : {"numpy", "ducc0"}

    Notes
    -----
    Shapes: whole rings ``(B_a, components, npoints_whole)`` real (every
    azimuth rank's points of these rings, azimuth rank after azimuth rank),
    orders ``(B_a, components, h, mmax)`` complex, ``B_a`` this azimuth
    rank's :func:`~mpisphere.split_sizes` chunk of the batch, ``h`` this
    rank's rings. Does not communicate; it runs inside a transform, which
    checked and agreed for it.
    """

    def __init__(self, tiles, batch, components, mmax, dtype, synthesis, layout, fft="numpy"):
        super().__init__(layout)
        grid, rings = tiles.grid, tiles.rings
        self.size, self.rank = grid.nazimuth, grid.azimuth_rank
        self.components, self.mmax, self.synthesis = components, mmax, synthesis
        self.real = numpy.dtype(dtype)
        self.complex = dtypes.complex_of(self.real)
        self.h = len(tiles.local_rings)
        self.own = split_sizes(batch, self.size)[self.rank]  # this azimuth rank's chunk of the batch
        nlon = rings.nlon[tiles.local_rings]
        # the whole-ring row: this rank's whole rings, ring after ring; the rings of one length form a group
        position = numpy.asarray(offsets_of(nlon.tolist()), dtype=numpy.int64)
        self.whole = int(nlon.sum())
        phi0 = rings.phi0[tiles.local_rings]
        self.groups = []
        for n in sorted(set(nlon.tolist())):
            rows = numpy.flatnonzero(nlon == n)
            self.groups.append(_Group(n, rows, position[rows], mmax, phi0[rows], self.real, self.complex,
                                      synthesis, layout, fft))
        # the gathered points (azimuth rank after azimuth rank) ring after ring: whole = gathered[..., ring_major];
        # back: gathered = whole[..., rank_major]. None on one azimuth rank, where the two orders are one
        self.ring_major = self.rank_major = None
        if self.size > 1:
            self.rank_major = numpy.concatenate([
                position[i] + split_offsets(int(n), self.size)[q] + numpy.arange(split_sizes(int(n), self.size)[q])
                for q in range(self.size) for i, n in enumerate(nlon)])
            self.ring_major = numpy.argsort(self.rank_major)
        self._workspace = backend.Workspace()
        self._device = {}

    # --- shapes ------------------------------------------------------------------------------------

    @property
    def _points_shape(self):
        return (self.own, self.components, self.whole)

    @property
    def _orders_shape(self):
        return (self.own, self.components, self.h, self.mmax)

    def _takes_points(self, direction):
        return (direction == FORWARD) != self.synthesis

    def _output(self, direction, spec):
        points = self._takes_points(direction)
        want = (self._points_shape, self.real) if points else (self._orders_shape, self.complex)
        other = (self._orders_shape, self.complex) if points else (self._points_shape, self.real)
        if tuple(spec.shape) != want[0] or spec.dtype != want[1]:
            raise InputError(f"expected {want[0]} {want[1].name}, got {spec.shape} {spec.dtype.name}")
        return spec.but(shape=other[0], dtype=other[1]), spec.describe()

    def _shapes(self, lead):
        return (self._points_shape, self._orders_shape) if not self.synthesis else \
            (self._orders_shape, self._points_shape)

    # --- running -----------------------------------------------------------------------------------

    def _run(self, direction, x, out, context):
        rows = self._orders_shape[0] * self.components
        if self._takes_points(direction):
            whole = self._gather_rings(x, rows, context)
            # the pipeline may hand this stage the orders in another memory order (the Legendre step's):
            # written C-ordered here, then copied over
            direct = out.flags.c_contiguous
            orders = out.reshape(rows, self.h, self.mmax) if direct else self._workspace.scratch(
                "orders", out, out.size).reshape(rows, self.h, self.mmax)
            for group in self.groups:
                self._orders_of_group(direction, group, whole, orders, context)
            if not direct:
                backend.copy_into(out, orders.reshape(out.shape))
            return
        if not x.flags.c_contiguous:
            copy = self._workspace.scratch("orders", x, x.size).reshape(x.shape)
            backend.copy_into(copy, x)
            x = copy
        orders = x.reshape(rows, self.h, self.mmax)
        direct = self.ring_major is None and out.flags.c_contiguous  # one azimuth rank: the rings are the output
        whole = out.reshape(rows, self.whole) if direct else \
            self._workspace.scratch("whole", x, rows * self.whole, self.real).reshape(rows, self.whole)
        for group in self.groups:
            self._group_of_orders(direction, group, orders, whole, context)
        if not direct:
            self._scatter_rings(whole, out, context)

    def _spectrum(self, like, rows, run, group):
        return self._workspace.scratch("spectrum", like, rows * run.count * group.half, self.complex).reshape(
            rows, run.count, group.half)

    def _orders_of_group(self, direction, group, whole, orders, context):
        """FFT of one length's rings, each order read from the frequency it aliases to (analysis forward,
        synthesis adjoint)."""
        xp = backend.array_module(whole)
        n, half, mmax = group.n, group.half, self.mmax
        for k, (run, _) in enumerate(group.runs):
            spectrum = self._spectrum(whole, whole.shape[0], run, group)
            group.fourier.run_agreed(direction, run.rings(whole, n), spectrum, context)
            target = orders[:, run.rows, :]
            if not group.aliased:
                target[...] = spectrum[..., :mmax]
            else:  # the ring's whole complex spectrum, read round and round
                full = self._workspace.scratch("full", whole, spectrum.size // half * n, self.complex).reshape(
                    spectrum.shape[:-1] + (n,))
                full[..., :half] = spectrum
                xp.conjugate(spectrum[..., n - half:0:-1], out=full[..., half:])
                target[...] = full[..., backend.on_device_of(full, group.index, self._device, ("index", n))]
            if self.synthesis:  # the adjoint of a synthesis: the doubled terms read twice
                target *= backend.on_device_of(target, group.factor, self._device, ("factor", n))
            if group.phases is not None:
                target *= backend.on_device_of(target, group.phases[k].conj(), self._device, ("phase-", n, k))

    def _group_of_orders(self, direction, group, orders, whole, context):
        """Each order added onto the frequency it aliases to, then the inverse FFT of one length's rings
        (synthesis forward, analysis adjoint)."""
        xp = backend.array_module(whole)
        n, half, mmax = group.n, group.half, self.mmax
        for k, (run, _) in enumerate(group.runs):
            picked = orders[:, run.rows, :]
            spectrum = self._spectrum(whole, whole.shape[0], run, group)
            if group.aliased:  # the orders in a buffer of whole turns round the ring (the input stays as it is)
                padded = self._workspace.scratch("padded", whole, spectrum.size // half * group.wraps * n,
                                                 self.complex).reshape(spectrum.shape[:-1] + (group.wraps * n,))
                padded[..., mmax:] = 0
            else:
                padded = spectrum
                padded[..., mmax:] = 0
            kept = padded[..., :mmax]
            kept[...] = picked
            if group.phases is not None:
                kept *= backend.on_device_of(kept, group.phases[k], self._device, ("phase+", n, k))
            if self.synthesis:
                kept *= backend.on_device_of(kept, group.factor, self._device, ("factor", n))
            if group.aliased:  # every turn summed onto the ring's complex spectrum, then its real half
                full = padded.reshape(padded.shape[:-1] + (group.wraps, n)).sum(axis=-2)
                spectrum[...] = full[..., :half]
                spectrum[..., 1:n - half + 1] += xp.conjugate(full[..., n - 1:half - 1:-1])
            group.fourier.run_agreed(direction, spectrum, run.rings(whole, n), context)

    def _gather_rings(self, x, rows, context):
        """This rank's whole rings, ring after ring, ``(B_a C, row)``, from the transposed points."""
        x = x.reshape(rows, self.whole) if x.flags.c_contiguous else \
            backend.array_module(x).ascontiguousarray(x).reshape(rows, self.whole)
        if self.ring_major is None:
            return x  # one azimuth rank: the points are the whole rings, ring after ring
        whole = self._workspace.scratch("whole", x, rows * self.whole, self.real).reshape(rows, self.whole)
        backend.array_module(x).take(x, self._index("ring-major", whole), axis=1, out=whole)
        return whole

    def _scatter_rings(self, whole, out, context):
        """The whole rings put back azimuth rank after azimuth rank, into ``out`` (for the transpose's adjoint)."""
        target = out.reshape(whole.shape) if out.flags.c_contiguous else \
            self._workspace.scratch("landed", out, whole.size, self.real).reshape(whole.shape)
        backend.array_module(whole).take(whole, self._index("rank-major", whole), axis=1, out=target)
        if not out.flags.c_contiguous:
            backend.copy_into(out, target.reshape(out.shape))

    def _index(self, which, like):
        index = self.ring_major if which == "ring-major" else self.rank_major
        return backend.on_device_of(like, index, self._device, which)
