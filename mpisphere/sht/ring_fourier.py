"""The Fourier side of a transform on a ring grid: whole rings from the azimuth ranks, one real FFT per ring length.

``RingFourier`` replaces the first three stages of a regular
transform's analysis (azimuth transpose, real FFT, truncation) and the last
three of its synthesis. Its analysis ``forward`` maps this rank's points
``(B, C, npoints)`` (its share of each of its rings) to the orders of its
rings for its share of the batch, ``(B_a, C, h, mmax)``, complex:

1. an ``Alltoallv`` over ``grid.azimuth`` (per-ring counts: each rank sends
   a chunk of the batch of all its points) gives every rank whole rings;
2. the rings of equal length are taken together, one batched real FFT per
   length (``rfft / nlon_j``);
3. each order ``m < mmax`` reads the frequency it aliases to on a ring of
   ``n`` points: ``m mod n``, or the conjugate of ``n - (m mod n)`` past the
   ring's Nyquist frequency, times ``exp(-i m phi0_j)``.

The synthesis ``forward`` is the reverse: each order's term
``c exp(i m phi) + conj`` is added onto the frequency it aliases to (twice
onto the real frequencies 0 and ``n / 2``), so the ring holds the exact
values of the band-limited field at its points, as ducc0's synthesis does;
then one unnormalised inverse FFT per length and the reverse
``Alltoallv``. Both adjoints are the steps' adjoints in reverse.

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

from .. import backend, collectives, dtypes
from ..operators import FORWARD, InputError
from ..partition import offsets_of, split_offsets, split_sizes
from .fourier import FourierStage
from .pipeline import LocalStage

__all__ = ["RingFourier", "aliased_frequency"]


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
    """Points of this rank's rings to their orders (analysis) or back (synthesis), over ``grid.azimuth``.

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
    Shapes: points ``(batch, components, npoints)`` real, orders
    ``(B_a, components, h, mmax)`` complex, ``B_a`` this azimuth rank's
    :func:`~mpisphere.split_sizes` chunk of the batch, ``h`` this rank's
    rings. Communicates on ``grid.azimuth`` (one ``Alltoallv`` per call);
    it runs inside a transform, which checked and agreed for it.
    """

    def __init__(self, tiles, batch, components, mmax, dtype, synthesis, layout, fft="numpy"):
        super().__init__(layout)
        grid, rings = tiles.grid, tiles.rings
        self.comm, self.size, self.rank = grid.azimuth, grid.nazimuth, grid.azimuth_rank
        self.batch, self.components, self.mmax, self.synthesis = batch, components, mmax, synthesis
        self.real = numpy.dtype(dtype)
        self.complex = dtypes.complex_of(self.real)
        self.npoints, self.h = tiles.npoints, len(tiles.local_rings)
        self.batch_sizes = split_sizes(batch, self.size)
        self.batch_offsets = split_offsets(batch, self.size)
        nlon = rings.nlon[tiles.local_rings]
        # every azimuth rank's points of these rings (the same rings: one polar rank)
        self.points_of = [sum(split_sizes(int(n), self.size)[q] for n in nlon) for q in range(self.size)]
        # the whole-ring row: this rank's whole rings, ring after ring; the rings of one length form a group
        position = numpy.asarray(offsets_of(nlon.tolist()), dtype=numpy.int64)
        self.whole = int(nlon.sum())
        phi0 = rings.phi0[tiles.local_rings]
        self.groups = []
        for n in sorted(set(nlon.tolist())):
            rows = numpy.flatnonzero(nlon == n)
            self.groups.append(_Group(n, rows, position[rows], mmax, phi0[rows], self.real, self.complex,
                                      synthesis, layout, fft))
        # where each azimuth rank's points go in the whole-ring row (None: they are the row, on one azimuth rank)
        self.places = [None] if self.size == 1 else [
            numpy.concatenate([position[i] + split_offsets(int(n), self.size)[q]
                               + numpy.arange(split_sizes(int(n), self.size)[q]) for i, n in enumerate(nlon)])
            for q in range(self.size)]
        self._workspace = backend.Workspace()
        self._device = {}

    # --- shapes ------------------------------------------------------------------------------------

    @property
    def _points_shape(self):
        return (self.batch, self.components, self.npoints)

    @property
    def _orders_shape(self):
        return (self.batch_sizes[self.rank], self.components, self.h, self.mmax)

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
        direct = self.size == 1 and out.flags.c_contiguous  # one azimuth rank: the rings are the output
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
            group.fourier._run(direction, run.rings(whole, n), spectrum, context)
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
            group.fourier._run(direction, spectrum, run.rings(whole, n), context)

    def _gather_rings(self, x, rows, context):
        """This rank's whole rings for its batch chunk, ``(B_a C, row)``, from every azimuth rank's points."""
        c, own = self.components, self.batch_sizes[self.rank]
        x = x if x.flags.c_contiguous else backend.array_module(x).ascontiguousarray(x)
        if self.size == 1:
            return x.reshape(rows, self.whole)  # the points are the whole rings, ring after ring
        whole = self._workspace.scratch("whole", x, rows * self.whole, self.real).reshape(rows, self.whole)
        recv_counts = [own * c * p for p in self.points_of]
        recv = self._workspace.scratch("received", x, sum(recv_counts), self.real)
        send_counts = [b * c * self.npoints for b in self.batch_sizes]
        collectives.alltoallv(self.comm, x.reshape(-1), send_counts, offsets_of(send_counts), recv, recv_counts,
                              offsets_of(recv_counts), staged=context.staged, workspace=self._workspace)
        start = 0
        for q in range(self.size):
            block = recv[start:start + own * c * self.points_of[q]].reshape(own * c, self.points_of[q])
            start += block.size
            whole[:, self._place(q, whole)] = block
        return whole

    def _scatter_rings(self, whole, out, context):
        """Every azimuth rank's points of this rank's batch chunk from ``whole``, to their owners (into ``out``)."""
        if self.size == 1:
            out[...] = whole.reshape(out.shape)
            return
        c, own = self.components, self.batch_sizes[self.rank]
        counts = [own * c * p for p in self.points_of]
        send = self._workspace.scratch("sent", whole, sum(counts), self.real)
        start = 0
        for q in range(self.size):
            block = send[start:start + counts[q]].reshape(own * c, self.points_of[q])
            start += counts[q]
            backend.array_module(whole).take(whole, self._place(q, whole), axis=1, out=block)
        recv_counts = [b * c * self.npoints for b in self.batch_sizes]
        target = out.reshape(-1) if out.flags.c_contiguous else \
            self._workspace.scratch("landed", out, sum(recv_counts), self.real)
        collectives.alltoallv(self.comm, send, counts, offsets_of(counts), target, recv_counts,
                              offsets_of(recv_counts), staged=context.staged, workspace=self._workspace)
        if not out.flags.c_contiguous:
            out[...] = target.reshape(out.shape)

    def _place(self, q, like):
        return backend.on_device_of(like, self.places[q], self._device, ("places", q))
