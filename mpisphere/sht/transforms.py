"""Distributed real spherical harmonic transforms with exact adjoints.

``DistributedRealSHT`` maps this rank's tile of real fields ``(..., nlat,
nlon)`` to its block of complex coefficients ``(..., lmax, mmax)`` (degrees
split over ``grid.polar``, orders over ``grid.azimuth``);
``DistributedInverseRealSHT`` maps back. Values, ordering, truncation and
normalisation follow torch-harmonics 0.9's ``RealSHT``/``InverseRealSHT``:

* forward: ``c[l, m] = sum_k W[m, l, k] X[k, m]``, ``X = rfft(x) / nlon``
  (``W`` = Legendre functions times ``2 pi`` times quadrature weights);
* inverse: ``x = irfft(sum_l P[m, l, k] c[l, m])`` without scaling (so a
  coefficient at ``m > 0`` stands for ``c e^{i m phi}`` plus its conjugate);
* truncation by :func:`~mpisphere.truncate_sht`.

A transform is a list of stages, read like torch-harmonics' numbered steps::

    forward (analysis)                       inverse (synthesis)
    1. azimuth transpose: longitudes whole   1. polar transpose: degrees whole
    2. real FFT, keep mmax orders            2. Legendre synthesis
    3. azimuth transpose: orders split       3. polar transpose: latitudes split
    4. polar transpose: latitudes whole      4. azimuth transpose: orders whole
    5. Legendre contraction                  5. zero-pad the orders, inverse FFT
    6. polar transpose: degrees split        6. azimuth transpose: longitudes split

and the adjoint of each is the same list of stage adjoints in reverse (so
``adjoint`` is the exact adjoint of the map, not its inverse).

Three Legendre strategies (``legendre=``) decide how the polar ranks share
the Legendre step; all give the same coefficients to rounding:

``"transpose"``
    the steps above: a polar transpose gives every rank all latitudes of a
    share of the batch; each rank holds its orders' tables at every
    latitude, parity-split (the fastest here, docs/benchmarks.md, but the
    tables do not shrink with the polar ranks).
``"reduce-scatter"``
    no polar transposes: each rank contracts its own latitudes into every
    degree (tables of its orders at its latitudes only, ``(m_loc, L,
    nlat_loc)``, so they shrink with every rank of the grid) and a
    ``Reduce_scatter`` over ``grid.polar`` completes the sums and splits
    the degrees; the synthesis gathers the degrees (``Allgatherv``) and
    evaluates its own latitudes. torch-harmonics 0.9.3's distributed
    transforms do the same.
``"table-free"``
    the reduce-scatter pattern with no tables at all: ducc0 evaluates the
    functions on the fly (scalar and vector transforms, host arrays), for
    grids whose tables fit nowhere (2049 x 4096 and finer).

Batch and component axes travel together through the transposes; only the
batch is split over ranks, never the two components of a vector field.
"""

import math

import inspect

import numpy

from .. import backend, dtypes
from ..legendre import NORMS
from ..agreement import Call, collective, description_of
from ..operators import DISTRIBUTED, FORWARD, InputError, Layout, LinearOperator, Spec
from ..grid_fields import gather_tiles
from ..partition import split_offsets, split_sizes
from ..validation import check_choice, check_dtype, check_int, check_process_grid
from ..primitives import ReduceScatter
from ..transpose import Transpose
from ..quadrature import latitudes, rule, truncate_sht
from . import contraction as kernels
from . import costs
from ..stages.fourier import FourierStage, Truncation, resolve_fft
from ..stages.pipeline import Pipeline
from .orders import ORDER_LAYOUTS, order_assignment, order_permutation
from .strategies import MachineModel
from .strategies.base import LegendreRequest

__all__ = ["Transform", "DistributedRealSHT", "DistributedInverseRealSHT"]


class _ConstructorSignature:
    """The class's ``__signature__``: its ``__init__``'s, as ``inspect.signature`` and Sphinx should show.

    The transforms define ``__new__(cls, *args, **kwargs)`` (to teach the
    torch-harmonics spelling), which ``inspect.signature`` would show
    instead. On instances the attribute is absent, so the signature of a
    transform object stays that of its ``__call__``.
    """

    def __get__(self, obj, cls):
        if obj is not None:
            raise AttributeError("__signature__")
        signature = inspect.signature(cls.__init__)
        return signature.replace(parameters=list(signature.parameters.values())[1:])


def _reject_torch_harmonics_call(cls, args, kwargs):
    """Teach the torch-harmonics spelling instead of failing on Python's argument binding."""
    grid = kwargs.get("grid", args[0] if args else None)
    if isinstance(kwargs.get("grid"), str) or (args and isinstance(args[0], (int, numpy.integer))):
        quadrature = kwargs.get("grid") if isinstance(kwargs.get("grid"), str) else None
        raise TypeError(
            f"{cls.__name__}: the first argument is the ProcessGrid the transform is spread over, then nlat and "
            "nlon; " + (f"pass the quadrature as quadrature={quadrature!r} (torch-harmonics calls it grid=)"
                        if quadrature else "e.g. DistributedRealSHT(ProcessGrid(comm), nlat, nlon, "
                        "quadrature='legendre-gauss')"))
    if grid is not None:
        check_process_grid(grid, "grid", cls.__name__)


class Transform(LinearOperator):
    """What the four transforms share: arguments, splits, tables, pipelines per batch size."""

    _synthesis = False     # an inverse transform: coefficients in, fields out
    _components = 1        # 2 for vector fields
    _table_kind = None     # "analysis" or "synthesis"

    __signature__ = _ConstructorSignature()

    def __new__(cls, *args, **kwargs):
        _reject_torch_harmonics_call(cls, args, kwargs)
        return super().__new__(cls)

    def __init__(self, grid, nlat, nlon, lmax=None, mmax=None, quadrature="equiangular", norm="ortho",
                 csphase=True, dtype=numpy.float64, *, contraction="auto", orders="contiguous", fft="auto",
                 legendre="auto", max_table_bytes=None, overlap=False):
        who = self.name
        if getattr(grid, "freed", False):
            raise RuntimeError(f"{who}: the grid was freed (grid.free())")
        self.grid = grid
        self.nlat = check_int(nlat, "nlat", who, minimum=1)
        self.nlon = check_int(nlon, "nlon", who, minimum=1)
        try:
            found = rule(quadrature)
        except ValueError as exc:
            raise ValueError(f"{who}: {exc}") from None
        if self.nlat < found.min_points:
            raise ValueError(f"{who}: the {found.name} rule needs at least {found.min_points} latitudes, got "
                             f"nlat={self.nlat}")
        self.quadrature = found.name
        lmax = None if lmax is None else check_int(lmax, "lmax", who, minimum=1)
        mmax = None if mmax is None else check_int(mmax, "mmax", who, minimum=1)
        self.lmax, self.mmax = truncate_sht(self.nlat, self.nlon, lmax, mmax, self.quadrature)
        self.norm = check_choice(norm, NORMS, "norm", who)
        self.csphase = bool(csphase)
        self.contraction = check_choice(contraction, kernels.METHODS, "contraction", who)
        try:
            self.fft = resolve_fft(fft)
        except (ValueError, ImportError) as exc:
            raise type(exc)(f"{who}: {exc}") from None
        self.dtype = check_dtype(dtype, "transformed", "dtype", who)
        self.cdtype = dtypes.complex_of(self.dtype)
        # mmax may exceed the nlon // 2 + 1 orders the longitudes resolve: the orders past them are zero in the
        # analysis and ignored by the synthesis (torch-harmonics' zero padding; the Truncation stage)
        for name, extent, ranks, axis in (("nlat", self.nlat, grid.npolar, "polar"),
                                          ("nlon", self.nlon, grid.nazimuth, "azimuth"),
                                          ("lmax", self.lmax, grid.npolar, "polar"),
                                          ("mmax", self.mmax, grid.nazimuth, "azimuth")):
            if extent < ranks:
                raise ValueError(f"{who}: the grid is finer than the transform: {ranks} {axis} ranks cannot "
                                 f"split {name}={extent} (each needs at least one); use at most {extent} {axis} ranks")
        self.orders = check_choice(orders, ORDER_LAYOUTS, "orders", who)
        self._assignment = order_assignment(self.mmax, self.lmax, grid.nazimuth, orders)
        self.theta, self.weights = self._latitudes()
        self._auto = legendre == "auto"
        self.strategy, self.legendre_reason = self._resolve_legendre(legendre, max_table_bytes)
        self.legendre = self.strategy.name
        # reading the machine model is part of building the transform: a file missing or corrupt on some rank is
        # one finding on every rank (raised there alone, it left the others waiting in the first call)
        call, self.machine = Call(grid.cart, who), None
        with call.local():
            self.machine = MachineModel.load() if self._auto else None
        call.agree()
        self._choices = backend.BoundedCache(16)  # each batch's strategy and why, by (batch, device, machine)
        others = costs.batch_candidates(self.strategy)[1:] if self._auto else ()
        if others:
            self.legendre_reason += (f"; per batch of host arrays, {' or '.join(repr(r.name) for r in others)} "
                                     "instead where the cost model gives it the shorter Legendre step (few "
                                     "fields: see legendre_for)")
        self.tile_shape = self._tile_shape()
        self.block_shape = (split_sizes(self.lmax, grid.npolar)[grid.polar_rank],
                            len(self._assignment[grid.azimuth_rank]))
        # coefficient blocks carry their order layout: a composition of transforms with different layouts
        # would combine different orders entry by entry, so Layout.mismatch refuses it
        grid_side = Layout(DISTRIBUTED, grid.cart)
        effective = "contiguous" if all(numpy.array_equal(a, c) for a, c in zip(
            self._assignment, order_assignment(self.mmax, self.lmax, grid.nazimuth))) else orders
        spectral_side = Layout(DISTRIBUTED, grid.cart, blocks=f"orders={effective}")
        if effective == "balanced":  # grid.gather of these blocks warns: gather_coefficients is the right call
            grid.balanced_blocks.add((tuple(self.block_shape), self.cdtype.str))
        self.domain, self.range = (spectral_side, grid_side) if self._synthesis else (grid_side, spectral_side)
        self.spectral_layout = spectral_side
        self._comm = grid.cart
        self._layout = Layout(DISTRIBUTED, grid.cart)
        self.tables = self._build_tables()
        self.overlap = bool(overlap)
        self._pipelines = backend.BoundedCache(4)
        self._scratch = backend.Workspace()
        self._second_scratch = backend.Workspace()

    def _latitudes(self):
        """``(theta, weights)`` of every latitude (ring), north pole first."""
        return latitudes(self.nlat, self.quadrature)

    def _latitude_key(self):
        """What identifies the latitudes in the grid's table cache."""
        return self.quadrature

    def _tile_shape(self):
        """The grid side of this rank's data: ``(h, w)``."""
        return self.grid.local_shape(self.nlat, self.nlon)

    def _resolve_legendre(self, legendre, budget):
        """The strategy record whose tables this transform holds (``legendre``, or what ``"auto"`` picks), and
        why."""
        return costs.resolve_legendre(legendre, budget, self.nlat, self.lmax, self.mmax, self.grid.npolar,
                                      self.grid.nazimuth, vector=self._components > 1, dtype=self.dtype,
                                      orders=self.orders, who=self.name)

    def legendre_for(self, batch, device=False):
        """The Legendre strategy a call with ``batch`` fields runs, and why: ``(name, reason)``.

        With ``legendre="auto"`` a batch of host arrays runs with the held
        tables' strategy (:attr:`legendre`) or with ``"table-free"``,
        whichever the cost model (:func:`mpisphere.sht.costs.choose_for_batch`
        on :attr:`machine`) gives the shorter Legendre step: on one rank a
        field or two read the whole table for little work, where ducc0's
        recurrence costs the same per field. Device arrays, and a strategy
        named explicitly, always run with :attr:`legendre`. ``batch``: the
        product of the leading axes (a vector field counts once).
        """
        batch = check_int(batch, "batch", f"{self.name}.legendre_for", minimum=1)
        record, why = self._strategy_for(batch, device)
        return record.name, why

    def _strategy_for(self, batch, device):
        """:meth:`legendre_for` as the strategy's record."""
        if not self._auto:
            return self.strategy, "chosen"
        padded = max(batch, self.grid.npolar, self.grid.nazimuth)
        return self._choices.get((padded, bool(device), self.machine), lambda: costs.choose_for_batch(
            self.strategy, self.machine, self.nlat, self.lmax, self.mmax, self.grid.npolar, self.grid.nazimuth,
            padded, vector=self._components > 1, dtype=self.dtype, orders=self.orders, synthesis=self._synthesis,
            device=device))

    def _describe(self):
        # the resolved strategy decides the messages: ranks that resolved "auto" differently must not meet; with
        # auto, each batch's strategy comes from the machine model, which must be the same on every rank too
        text = description_of(self)
        model = f", {self.machine.describe()}" if self.machine is not None else ""
        return f"{text[:-1]}, legendre resolved={self.legendre!r}{model})"

    def free(self):
        """Drop the cached pipelines (their transposes' buffers with them) and the grid's shared scratch.

        Everything is rebuilt on the next call; the tables stay. For a
        program that transforms once and then needs the memory for
        something else. Not collective.
        """
        self._pipelines.clear()
        self._scratch.clear()
        self._second_scratch.clear()
        self.grid.scratch.clear()

    # --- what a rank holds -------------------------------------------------------------

    @property
    def local_degrees(self):
        """Global degrees ``l`` of this rank's block rows, in order (an int array)."""
        start = split_offsets(self.lmax, self.grid.npolar)[self.grid.polar_rank]
        return numpy.arange(start, start + self.block_shape[0])

    @property
    def local_orders(self):
        """Global orders ``m`` of this rank's block columns, increasing (an int array).

        ``orders="contiguous"``: a :func:`~mpisphere.split_sizes` chunk of
        ``0 .. mmax - 1``; ``"balanced"``: a zig-zag selection (see
        :mod:`mpisphere.sht.orders`). Index blocks with it, never with offsets.
        """
        return self._assignment[self.grid.azimuth_rank].copy()

    @collective
    def gather_coefficients(self, block, root=0):
        """Assemble every rank's coefficient block into the whole ``(..., lmax, mmax)`` array on ``root``.

        ``grid.gather`` in either order layout: the columns come back in
        global order. ``block``: this rank's ``(..., l_loc, m_loc)`` (or
        ``(..., 2, l_loc, m_loc)``). Returns ``None`` on the other ranks.
        Collective over ``grid.cart``.
        """
        call = Call(self.grid.cart, f"{self.name}.gather_coefficients")
        if not backend.is_array(block) or tuple(block.shape[-2:]) != tuple(self.block_shape) \
                or numpy.dtype(block.dtype) != self.cdtype:
            call.fail(f"expected this rank's coefficient block (..., {self.block_shape[0]}, {self.block_shape[1]}) "
                      f"{self.cdtype.name}, got {type(block).__name__} {getattr(block, 'shape', '')} "
                      f"{getattr(block, 'dtype', '')}".rstrip())
        call.agree(f"{self._describe()} root={root!r}")
        gathered = gather_tiles(self.grid, block, root, warn_balanced=False)  # the columns are put in order below
        if gathered is None or self.orders == "contiguous":
            return gathered
        whole = backend.array_module(gathered).empty_like(gathered)
        whole[..., order_permutation(self._assignment)] = gathered
        return whole

    @collective
    def scatter_coefficients(self, whole, root=0):
        """This rank's block of the whole ``(..., lmax, mmax)`` coefficient array held on ``root``.

        The inverse of :meth:`gather_coefficients` (``grid.scatter`` in
        either order layout). Collective over ``grid.cart``.
        """
        if whole is not None and self.grid.rank == root and self.orders != "contiguous":
            whole = whole[..., order_permutation(self._assignment)]
        return self.grid.scatter(whole, root)

    @property
    def local_colatitudes(self):
        """Colatitudes (radians, north pole 0) of this rank's tile rows."""
        lat, _ = self.grid.local_slices(self.nlat, self.nlon)
        return self.theta[lat].copy()

    @property
    def local_longitudes(self):
        """Longitudes (radians, ``2 pi j / nlon`` from 0, increasing eastward) of this rank's tile columns."""
        _, lon = self.grid.local_slices(self.nlat, self.nlon)
        return 2.0 * math.pi * numpy.arange(lon.start, lon.stop) / self.nlon

    def table_bytes(self):
        """Bytes of Legendre tables this transform uses on this rank (its own orders only; 0 table-free).

        An analysis and a synthesis on one grid with the same parameters
        share one table: each reports it.
        """
        return 0 if self.tables is None else self.tables.nbytes()

    # --- the shape contract ---------------------------------------------------------------

    def _core(self, side):
        shape = self.tile_shape if side == "grid" else self.block_shape
        return ((self._components,) if self._components > 1 else ()) + tuple(shape)

    def _sides(self):
        """(domain side, range side): "grid" (real tiles) or "spectral" (complex blocks)."""
        return ("spectral", "grid") if self._synthesis else ("grid", "spectral")

    def _shapes(self, lead):
        domain, range_ = self._sides()
        return tuple(lead) + self._core(domain), tuple(lead) + self._core(range_)

    def _dtypes(self):
        return tuple(self.dtype if side == "grid" else self.cdtype for side in self._sides())

    def _output(self, direction, spec):
        side_in, side_out = self._sides() if direction == FORWARD else self._sides()[::-1]
        core = self._core(side_in)
        want = self.dtype if side_in == "grid" else self.cdtype
        what = "real fields" if side_in == "grid" else "complex coefficients"
        if spec.dtype != want:
            hint = (" (real input to a transform that takes coefficients?)" if side_in == "spectral" and
                    spec.dtype.kind != "c" else " (complex input to a transform that takes fields?)"
                    if side_in == "grid" and spec.dtype.kind == "c" else "; build the operator with the matching dtype")
            raise InputError(f"expected {what} of dtype {want.name}, got {spec.dtype.name}{hint}", TypeError)
        if len(spec.shape) < len(core) or spec.shape[len(spec.shape) - len(core):] != core:
            raise InputError(self._shape_refusal(side_in, core, spec.shape))
        if spec.device and not self.strategy.runs_on_device:
            how = (f"legendre='auto' chose it ({self.legendre_reason}); give the tables room with max_table_bytes= "
                   "or pass legendre='reduce-scatter'" if self._auto else
                   "build the transform with legendre='transpose' or 'reduce-scatter' for device arrays")
            raise InputError(f"legendre={self.legendre!r} runs on host arrays only (ducc0 evaluates its functions on "
                             f"the CPU), got a device (CuPy) array; {how}", TypeError)
        lead = spec.shape[:len(spec.shape) - len(core)]
        result = spec.but(shape=lead + self._core(side_out), dtype=self.dtype if side_out == "grid" else self.cdtype)
        return result, spec.describe(range(len(spec.shape) - len(core) + (self._components > 1), len(spec.shape)))

    def _whole_shape(self):
        """The grid side of the whole field, ``(nlat, nlon)``: what a rank passes by mistake for its tile."""
        return (self.nlat, self.nlon)

    def _shape_refusal(self, side_in, core, shape):
        """The finding for an input whose trailing axes are not this rank's: the cause, what to do, the details."""
        g = self.grid
        comp = " (2 components first)" if self._components > 1 else ""
        where = (f"  rank {g.rank} (polar {g.polar_rank}, azimuth {g.azimuth_rank} of a {g.npolar} x {g.nazimuth} "
                 f"grid): expected {core}{comp} in the last {len(core)} axes, got shape {tuple(shape)}")
        if side_in != "grid":
            return (f"the input is not this rank's coefficient block\n  fix: pass the block this rank's forward "
                    f"transform returns (transform.block_shape), or sht.scatter_coefficients(whole)\n{where}")
        whole = self._whole_shape()
        points = len(whole) == 1
        if g.size > 1 and tuple(shape[len(shape) - len(whole):]) == whole:
            return (f"got the whole field {whole} where this rank's {'points' if points else 'tile'} belong"
                    f"{'' if points else 's'}\n  fix: give each rank its own part: "
                    + ("tiles.scatter(field) (mpisphere.RingTiles), of (..., tiles.npoints)" if points else
                       f"grid.scatter(field), of shape (..., *grid.local_shape({whole[0]}, {whole[1]}))")
                    + f"\n{where}")
        what = "set of points" if points else "tile"
        return (f"the input's last {len(core)} axes are not this rank's {what}\n  fix: pass this rank's {what} "
                + ("(RingTiles.npoints)" if points else f"(grid.local_shape({whole[0]}, {whole[1]}))")
                + f" with any leading axes{comp}\n{where}")

    # --- running ------------------------------------------------------------------------------

    def _run(self, direction, x, out, context):
        side_in, side_out = self._sides() if direction == FORWARD else self._sides()[::-1]
        core_in, core_out = len(self._core(side_in)), len(self._core(side_out))
        lead = x.shape[:x.ndim - core_in]
        batch = math.prod(lead)
        padded = max(batch, self.grid.npolar, self.grid.nazimuth)  # the transposes split the batch
        c = self._components
        tail = x.shape[x.ndim - core_in + (c > 1):]
        if padded == batch and x.flags.c_contiguous:
            xb = x.reshape((batch, c) + tail)
        else:
            xb = self._scratch.scratch("in", x, padded * c * math.prod(tail))
            xb = xb.reshape((padded, c) + tail)
            xb[:batch] = x.reshape((batch, c) + tail)
            xb[batch:] = 0
        target_tail = out.shape[out.ndim - core_out + (c > 1):]
        direct = padded == batch and out.flags.c_contiguous
        if direct:
            target = out.reshape((batch, c) + target_tail)
        else:
            target = self._scratch.scratch("out", out, padded * c * math.prod(target_tail))
            target = target.reshape((padded, c) + target_tail)
        widest = max(self.grid.npolar, self.grid.nazimuth)
        if self.overlap and padded >= 2 * widest:
            # two chunks in turns: one chunk's transposes travel while the other computes (its own buffers)
            half = padded // 2
            Pipeline.run_interleaved([
                (self._pipeline(half, xb), direction, xb[:half], target[:half], context),
                (self._pipeline(padded - half, xb, second=True), direction, xb[half:], target[half:], context)])
        else:
            self._pipeline(padded, xb).run(direction, xb, target, context)
        if not direct:
            out[...] = target[:batch].reshape(out.shape)

    def _pipeline(self, batch, like, second=False):
        """The pipeline for ``batch`` fields; ``second``: the overlap's other chunk, with buffers of its own."""
        workspace = self._second_scratch if second else self.grid.scratch
        device = backend.is_device_array(like)
        record, _ = self._strategy_for(batch, device)
        return self._pipelines.get((batch, device, second, record.name),
                                   lambda: self._build_pipeline(batch, workspace, record))

    def _fourier_stages(self, batch):
        """The stages between this rank's fields and the ``(B_a, C, h, mmax)`` orders, in the pipeline's order.

        Analysis: the azimuth transpose (``(B, C, h, w)`` -> ``(B_a, C, h, nlon)``), the real FFT, the
        truncation (which puts the orders in the layout's order); a synthesis the reverse. A grid of another
        kind gives its own.
        """
        lon = Transpose(self.grid.azimuth, axes=(0, 3), extents=(batch, self.nlon))
        fft = FourierStage(self.nlon, self.dtype, self._synthesis, self._layout, self.fft)
        truncation = Truncation(self.mmax, self.nlon // 2 + 1, self._layout, order_permutation(self._assignment))
        return [truncation.H, fft, lon.H] if self._synthesis else [lon, fft, truncation]

    def _latitude_chunks(self):
        """Every polar rank's latitudes: ``nlat`` split by ``split_sizes`` (a ring grid: its rings' split)."""
        return self.nlat

    def _shared_tables(self, key, build):
        """Tables from the grid's cache, shared by every transform on the grid that needs the same ones.

        The cache holds them weakly: they are freed with the last transform that uses them.
        """
        cache = self.grid.table_cache
        key = (key, self.legendre, self.lmax, tuple(self.local_orders.tolist()), self.nlat, self._latitude_key(),
               self.csphase, self.dtype.str)
        tables = cache.get(key)
        if tables is None:
            tables = cache[key] = build()
        return tables

    def _own_latitudes(self):
        """This rank's latitude rows (a slice of ``theta``)."""
        lat, _ = self.grid.local_slices(self.nlat, self.nlon)
        return lat

    _tables_kind = "scalar"

    def _legendre_request(self):
        """What this transform asks of its Legendre strategy (a :class:`~.strategies.base.LegendreRequest`)."""
        return LegendreRequest(
            kind=self._tables_kind, lmax=self.lmax, orders=self.local_orders, theta=self.theta,
            own=self._own_latitudes(), npolar=self.grid.npolar, norm=self.norm, csphase=self.csphase,
            synthesis=self._table_kind == "synthesis", dtype=self.dtype, cdtype=self.cdtype,
            weights=2.0 * math.pi * self.weights if self._table_kind == "analysis" else None, layout=self._layout,
            contraction=self.contraction)

    def _build_tables(self):
        # unweighted (the analysis applies the weights in its contraction), so an analysis and a synthesis
        # share one table; norms other than "ortho" scale analysis and synthesis by different degree factors
        # (the vector functions are orthonormal whatever the norm: the coupling applies it)
        record = self.strategy
        if not record.holds_tables:
            return None
        inverse = self._table_kind == "synthesis"
        key = (self._tables_kind,) + ((self.norm, inverse if self.norm != "ortho" else None)
                                      if self._tables_kind == "scalar" else ())
        return self._shared_tables(key, lambda: record.build_tables(self._legendre_request()))

    def _degree_stages(self):
        """Local stages between the Legendre step and the degree transpose (none for scalar fields)."""
        return []

    def _build_pipeline(self, batch, workspace, record):
        """The stages of one batch size, in analysis order (a synthesis runs their adjoints in reverse)::

            Fourier stages -> orders split (azimuth transpose) -> latitudes whole (polar transpose)
            -> Legendre -> degree stages -> degrees split (polar transpose, or Reduce_scatter)
        """
        g = self.grid
        tables = self.tables if record is self.strategy else None  # a batch's other strategy holds none
        legendre = record.stage(self._legendre_request(), tables)
        fourier = self._fourier_stages(batch)
        orders = Transpose(g.azimuth, axes=(3, 0), extents=(self.mmax, batch))  # (Ba, C, h, mmax) -> (B, C, h, m)
        if record.polar_transposes:
            polar = [Transpose(g.polar, axes=(0, 2), extents=(batch, self._latitude_chunks()))]  # -> (Bp, C, nlat, m)
            degrees = Transpose(g.polar, axes=(2, 0), extents=(self.lmax, batch))  # (Bp, C, L, m) -> (B, C, l, m)
        else:
            # each polar rank contracts its own latitudes into every degree; a Reduce_scatter over the polar
            # ranks completes the sums and splits the degrees (the synthesis: an Allgatherv of the degrees)
            polar, degrees = [], ReduceScatter(g.polar, 2, self.lmax)
        extra = self._degree_stages()
        # the memory layouts of the intermediates are the pipeline's to plan, from what the stages declare
        if not self._synthesis:
            stages = [*fourier, orders, *polar, legendre, *extra, degrees]
            spec = Spec((batch, self._components) + self.tile_shape, self.dtype, False)
        else:
            stages = [degrees.H, *extra, legendre.H, *[t.H for t in polar], orders.H, *fourier]
            spec = Spec((batch, self._components) + self.block_shape, self.cdtype, False)
        return Pipeline(stages, spec, workspace)


class DistributedRealSHT(Transform):
    """Forward real SHT of distributed tiles.

    Parameters
    ----------
    grid : ProcessGrid
    nlat, nlon : int
        Global grid: latitudes (north pole first) and longitudes.
    lmax, mmax : int, optional
        Number of degrees and orders kept, resolved by
        :func:`~mpisphere.truncate_sht` (torch-harmonics 0.9's rule).
    quadrature : {"equiangular", "legendre-gauss", "lobatto"}
        The latitude rule (torch-harmonics' ``grid=``).
    norm : {"ortho", "schmidt", "four-pi"}
    csphase : bool
        Condon-Shortley phase.
    dtype : numpy.float32 or numpy.float64
        Real dtype of the fields; coefficients are the matching complex type.
    contraction : {"auto", "per-order", "batched"}, keyword-only
        One matrix product per order (NumPy's default) or one batched product
        over zero-padded tables (CuPy's default: one kernel instead of
        hundreds).
    orders : {"contiguous", "balanced"}, keyword-only
        Which orders each azimuth rank holds (:mod:`mpisphere.sht.orders`):
        torch-harmonics' contiguous chunks (default), or a zig-zag that
        gives every rank the same Legendre work and table bytes (within
        0.2% at 361 x 720 on 8 ranks, where the contiguous layout gives the
        first rank 1.9 times the mean). Transforms combined in one
        computation must use the same layout; compositions check it.
    fft : {"auto", "numpy", "ducc0"}, keyword-only
        The real FFTs of NumPy arrays: ducc0's (about twice as fast as
        NumPy's on one core; ``pip install '.[ducc0]'``) when
        installed (``"auto"``), else NumPy's. CuPy arrays use ``cupy.fft``.
    legendre : {"auto", "transpose", "reduce-scatter", "table-free"}, keyword-only
        How the Legendre step is spread over the polar ranks (see the module
        notes). ``"auto"`` (default) keeps ``"transpose"`` while its tables
        fit ``max_table_bytes`` and otherwise shrinks them; the choice and
        why are in :attr:`legendre` and ``legendre_reason``.
    max_table_bytes : int, keyword-only
        With ``legendre="auto"``: the most bytes of tables one rank may
        hold (default ``mpisphere.sht.costs.default_table_budget``, half
        the machine's memory per core).
    overlap : bool, keyword-only
        Run the batch in two chunks in turns, each chunk's transposes
        started without blocking while the other chunk computes (needs a
        batch of at least twice the larger grid axis; the rest run as one
        chunk). Off by default: with MPICH's shared-memory transport on
        two cores it hid nothing (:doc:`/benchmarks`, "Overlapping a
        transpose with work"); a network that progresses on its own may
        gain. Costs a second set of pipeline buffers.

    Notes
    -----
    ``forward``: ``(..., h, w)`` real (this rank's tile of ``(nlat, nlon)``)
    -> ``(..., l_loc, m_loc)`` complex (this rank's block of ``(lmax, mmax)``:
    degrees ``local_degrees`` split over ``grid.polar``, orders
    ``local_orders`` over ``grid.azimuth``). ``adjoint``: the exact
    adjoint, ``(..., l_loc, m_loc)`` -> ``(..., h, w)``. Any number of
    leading axes, of any size (the same on every rank). Collective over
    ``grid.cart``: the ranks agree once per call, then run the stages.
    """

    _table_kind = "analysis"


class DistributedInverseRealSHT(Transform):
    """Inverse real SHT: coefficient blocks to distributed tiles.

    Same parameters as :class:`DistributedRealSHT`.

    Notes
    -----
    ``forward``: ``(..., l_loc, m_loc)`` complex -> ``(..., h, w)`` real.
    ``adjoint``: the exact adjoint, ``(..., h, w)`` -> ``(..., l_loc, m_loc)``.
    """

    _synthesis = True
    _table_kind = "synthesis"
