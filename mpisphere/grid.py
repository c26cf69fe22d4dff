"""The 2-D Cartesian grid of MPI ranks that fields on the sphere are spread over.

Latitudes (rows of a ``(..., nlat, nlon)`` field) are split over the polar
axis of the grid, longitudes (columns) over the azimuth axis. The polar axis
is not periodic (there is nothing north of the north pole); the azimuth axis
is (longitude wraps around). Ranks of ``grid.cart`` are numbered row-major,
so rank ``r`` has polar index ``r // nazimuth`` and azimuth index
``r % nazimuth``; ``order="polar-fastest"`` lays a model's ranks out the
other way round (see :class:`ProcessGrid`).
"""

import contextlib
import math
import os
import sys
import warnings
import weakref

import numpy
from mpi4py import MPI

from . import backend, collectives, cuda_aware
from .agreement import REFUSED, Call, CallGuard, InputError, collective, guarded, raise_everywhere
from .agreement.failures import Failures, raise_finding
from .agreement.stall import ExitNotice
from .launch import world_mismatch
from .partition import split_sizes
from .grid_fields import check_alive, gather_tiles, scatter_field
from .tiling import RegularTiling
from .validation import check_choice, check_int

__all__ = ["ProcessGrid", "GridComm", "ORDERS", "check_tile"]

ORDERS = ("azimuth-fastest", "polar-fastest")


class GridComm(MPI.Cartcomm):
    """A communicator of a :class:`ProcessGrid`: an mpi4py ``Cartcomm`` that knows its grid.

    ``grid.cart``, ``grid.polar`` and ``grid.azimuth`` are instances. They
    behave as the ``Cartcomm`` handles they wrap, and add

    ``space``
        the grid's whole communicator, over which the inner products of
        operators built on any of them sum (an operator on ``grid.polar``
        runs as one copy per column of the grid; together the copies map the
        whole field);
    ``guard``
        one :class:`~mpisphere.agreement.CallGuard` per grid, held while an
        operator communicates on any of its communicators: a second thread
        that tries raises instead of mixing its messages with the first
        one's, and the other ranks raise for that call too (use
        :meth:`ProcessGrid.dup` for a grid of its own).
    """

    @classmethod
    def _wrap(cls, comm, name, space, guard):
        wrapped = cls(comm)
        wrapped.space = wrapped if space is None else space
        wrapped.guard = guard
        wrapped.agreements = 0   # this communicator's agreements so far (stall notes say which one they are about)
        wrapped.failures = Failures(wrapped) if space is None else None  # on the whole grid's communicator
        # on the whole grid's communicator, set by its first halo exchange: answers the neighbours' halo calls
        # made instead of an agreement this rank waits in (mpisphere.halo.absent)
        wrapped.answers = None
        wrapped.Set_name(name)
        return wrapped


def check_tile(grid, spec, whole, dtype, channels=None, what=None):
    """This rank's finding (:class:`~mpisphere.agreement.InputError`) for an input that is not its tile of ``whole``.

    ``spec``'s last axes must be ``grid.local_shape(*whole)``, after a
    ``channels`` axis when given, and its dtype ``dtype``; the message
    names the whole field given where a tile belongs. ``what`` prefixes it
    (``"input"``, ``"y_bar"``). The local check of the operators on tiles.
    """
    prefix = f"{what}: " if what else ""
    if spec.dtype != dtype:
        raise InputError(f"{prefix}expected {numpy.dtype(dtype).name}, got {spec.dtype.name}", TypeError)
    core = ((channels,) if channels is not None else ()) + tuple(grid.local_shape(*whole))
    shape = tuple(spec.shape)
    if len(shape) >= len(core) and shape[len(shape) - len(core):] == core:
        return
    if len(shape) >= len(core) and shape[-2:] == tuple(whole) and grid.size > 1:
        cause = f"got the whole {whole[0]} x {whole[1]} field where this rank's tile belongs"
    elif channels is not None:
        cause = f"the last three axes of {shape} are not (channels, *this rank's tile)"
    else:
        cause = f"the last two axes of {shape} are not this rank's tile"
    lead = "..., " + (f"{channels}, " if channels is not None else "")
    raise InputError(f"{prefix}{cause}\n  fix: pass ({lead}*grid.local_shape{tuple(whole)}) per rank (grid.scatter "
                     f"gives each rank its tile)\n  rank {grid.rank}: expected (..., {', '.join(map(str, core))}), "
                     f"got {shape}")


def check_finite(grid, x, whole, what):
    """This rank's finding for a tile ``x`` (``(..., h, w)`` of ``whole``) that holds an inf or a NaN, naming its
    first such point in the whole field's indices.

    One pass over ``x``: its sum is finite when every value is (an inf or a
    NaN makes any sum inf or NaN); the exact search runs only when the sum is
    not, which finite values that overflow it also cause.
    """
    xp = backend.array_module(x)
    if math.isfinite(float(xp.sum(x))) or bool(xp.isfinite(x).all()):
        return
    index = tuple(int(i) for i in numpy.unravel_index(int(xp.argmin(xp.isfinite(x))), x.shape))
    value = float(x[index])
    lat, lon = grid.local_slices(*whole)
    lead = index[:-2]
    raise InputError(
        f"{what}: a non-finite value ({value}) at {'index ' + str(lead) + ', ' if lead else ''}latitude "
        f"{lat.start + index[-2]}, longitude {lon.start + index[-1]} of the {whole[0]} x {whole[1]} grid (its "
        f"tile's row {index[-2]}, column {index[-1]}): the FFT along longitudes would spread it over its whole "
        "latitude ring and beyond the filter's reach\n  fix: fill the missing values (e.g. with 0) and pass where "
        "they are as another channel (a mask)")


def _resolve_dims(size, npolar, nazimuth):
    """The grid dims for a communicator of ``size`` ranks (same answer on every rank), or ValueError."""
    if npolar is None and nazimuth is None:
        npolar, nazimuth = MPI.Compute_dims(size, 2)
    elif npolar is None or nazimuth is None:
        given_name, given = ("npolar", npolar) if nazimuth is None else ("nazimuth", nazimuth)
        if size % given:
            raise ValueError(f"ProcessGrid: {given_name}={given} does not divide the communicator size {size}")
        other = size // given
        npolar, nazimuth = (given, other) if nazimuth is None else (other, given)
    if npolar * nazimuth != size:
        wanted = npolar * nazimuth
        fix = (f"\n  fix: start the program under the MPI launcher, e.g. mpiexec -n {wanted} python -m mpi4py "
               f"{_program()} (srun -n {wanted} under Slurm); run as plain python it is one rank"
               if size == 1 else
               f"\n  fix: launch {wanted} ranks (mpiexec -n {wanted}), or choose npolar x nazimuth = {size} "
               "(ProcessGrid(comm) picks the dims itself)")
        raise ValueError(
            f"ProcessGrid: npolar x nazimuth = {npolar} x {nazimuth} = {wanted} ranks, "
            f"but the communicator has {size}{fix}")
    return npolar, nazimuth


def _program():
    """The running script's name for a suggested command line (``script.py`` when there is none)."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    return name if name.endswith(".py") else "script.py"


def _requested(npolar, nazimuth, order):
    """This rank's request, checked locally: ``((npolar, nazimuth, order), error text or None)``."""
    try:
        npolar = None if npolar is None else check_int(npolar, "npolar", "ProcessGrid", minimum=1)
        nazimuth = None if nazimuth is None else check_int(nazimuth, "nazimuth", "ProcessGrid", minimum=1)
        check_choice(order, ORDERS, "order", "ProcessGrid")
    except (TypeError, ValueError) as exc:
        return (repr(npolar), repr(nazimuth), repr(order)), (type(exc).__name__, str(exc))
    return (npolar, nazimuth, order), None


class ProcessGrid:
    """A ``npolar x nazimuth`` Cartesian grid of ranks over a communicator.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm, optional
        Communicator to build the grid on; default ``MPI.COMM_WORLD``. The
        grid's communicators are new ones (``Create_cart``), so traffic on
        ``comm`` never matches mpisphere's messages.
    npolar, nazimuth : int, optional
        Grid dimensions; their product must equal ``comm``'s size. Either or
        both may be omitted: ``MPI.Compute_dims`` (or the division of the size
        by the one given) fills them in.
    order : {"azimuth-fastest", "polar-fastest"}, keyword-only
        How ``comm``'s ranks map to grid positions. ``"azimuth-fastest"``
        (default): rank ``r`` of ``comm`` sits at polar index
        ``r // nazimuth``, azimuth index ``r % nazimuth``.
        ``"polar-fastest"``: polar index ``r % npolar``, azimuth index
        ``r // npolar`` (a model that numbers its ranks latitude-fastest, as
        ``MPI_Cart_create`` does with the longitude dimension listed first).
        ``grid.cart`` is always numbered row-major; ``grid.comm_rank`` is the
        rank in ``comm``. A model whose own tiles must match mpisphere's can
        check them with :meth:`check_tile`.

    Attributes
    ----------
    cart : GridComm
        Cartesian communicator, dims ``[npolar, nazimuth]``, periods
        ``[False, True]``, ranks row-major.
    polar : GridComm
        The ranks that share this rank's azimuth index (a column of the grid);
        its rank is ``polar_rank``. Latitude splits use it.
    azimuth : GridComm
        The ranks that share this rank's polar index (a row of the grid); its
        rank is ``azimuth_rank``. Longitude splits use it.
    npolar, nazimuth : int
    rank, size : int
        This rank and the number of ranks in ``cart``.
    polar_rank, azimuth_rank : int
    polar_neighbors : (int, int)
        ``(north, south)`` ranks in ``polar``, ``MPI.PROC_NULL`` past the poles.
    azimuth_neighbors : (int, int)
        ``(west, east)`` ranks in ``azimuth``, periodic.
    cuda_aware : (bool, str)
        The CUDA-aware decision agreed over ``cart`` at construction,
        and where it came from (see :mod:`mpisphere.cuda_aware`).

    Raises
    ------
    ValueError
        On every rank, before the grid's communicators are created: dims
        that do not multiply to the communicator size, a dim that is not
        positive, or ranks that ask for different grids.
    RuntimeError
        When the MPI world has one rank but the launcher started more
        processes (``srun`` with a PMI plugin the MPI does not speak): the
        message says which ``--mpi=`` to use.

    Notes
    -----
    Construction and :meth:`free` are collective over ``comm``. Free the
    grid with :meth:`free` or use it as a context manager; a grid dropped
    without either warns (``ResourceWarning``), because freeing a
    communicator is collective and cannot safely happen in a destructor.
    """

    def __init__(self, comm=None, npolar=None, nazimuth=None, *, order="azimuth-fastest"):
        self._freed = True  # until the communicators exist
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm):
            hint = " (pass a communicator such as MPI.COMM_WORLD)" if isinstance(comm, ProcessGrid) else ""
            raise TypeError(f"ProcessGrid: comm must be an mpi4py Intracomm, got {type(comm).__name__}{hint}")
        if comm == MPI.COMM_NULL:
            raise ValueError("ProcessGrid: comm is MPI.COMM_NULL")
        mismatch = world_mismatch(MPI.COMM_WORLD.Get_size())
        if mismatch is not None:
            raise RuntimeError(f"ProcessGrid: {mismatch}")
        request, error = _requested(npolar, nazimuth, order)
        everyone = collectives.allgather_object(comm, (request, error))
        errors = [(r, e) for r, (_, e) in enumerate(everyone) if e is not None]
        if errors:
            kinds = {kind for _, (kind, _) in errors}
            cls = TypeError if kinds == {"TypeError"} else ValueError
            raise cls(" | ".join(f"rank {r}: {text}" for r, (_, text) in errors[:4])
                      + (f" | and {len(errors) - 4} more ranks" if len(errors) > 4 else ""))
        odd = [r for r, (req, _) in enumerate(everyone) if req != everyone[0][0]]
        if odd:
            def show(req):
                return f"npolar={req[0]}, nazimuth={req[1]}, order={req[2]!r}"
            raise ValueError("ProcessGrid: ranks asked for different grids: rank 0 " + show(everyone[0][0]) + "; "
                             + "; ".join(f"rank {r} {show(everyone[r][0])}" for r in odd[:4]))
        self.npolar, self.nazimuth = _resolve_dims(comm.Get_size(), npolar, nazimuth)
        self.order = order
        self.comm_rank = comm.Get_rank()
        owned = []
        if order == "polar-fastest":
            p, a = self.comm_rank % self.npolar, self.comm_rank // self.npolar
            comm = comm.Split(0, p * self.nazimuth + a)
            owned.append(comm)
        self.guard = CallGuard()
        cart = comm.Create_cart([self.npolar, self.nazimuth], periods=[False, True], reorder=False)
        self.cart = GridComm._wrap(cart, "grid.cart", None, self.guard)
        self.polar = GridComm._wrap(self.cart.Sub([True, False]), "grid.polar", self.cart, self.guard)
        self.azimuth = GridComm._wrap(self.cart.Sub([False, True]), "grid.azimuth", self.cart, self.guard)
        self._owned = owned
        self._freed = False
        self.polar_rank = self.polar.Get_rank()
        self.azimuth_rank = self.azimuth.Get_rank()
        self.rank = self.cart.Get_rank()
        self.size = self.cart.Get_size()
        north = self.polar_rank - 1 if self.polar_rank > 0 else MPI.PROC_NULL
        south = self.polar_rank + 1 if self.polar_rank < self.npolar - 1 else MPI.PROC_NULL
        self.polar_neighbors = (north, south)
        self.azimuth_neighbors = ((self.azimuth_rank - 1) % self.nazimuth,
                                  (self.azimuth_rank + 1) % self.nazimuth)
        self.cuda_aware = cuda_aware.decide(self.cart)
        # the intermediates of the transforms on this grid: their runs never overlap (the lock), so they share
        self.scratch = backend.Workspace()
        # Legendre tables shared by the transforms on this grid that need the same ones; held weakly, so they
        # are freed with the last transform that uses them
        self.table_cache = weakref.WeakValueDictionary()
        # (block shape, complex dtype) of the transforms built on this grid with orders="balanced": their blocks
        # hold other columns than the contiguous ones grid.gather assumes (the call warns; see gather)
        self.balanced_blocks = set()
        # the tiles in memory shared on the node (HaloExchange.zeros), made by the first such allocation
        self.node_memory = None
        # a rank that exits with the grid in use tells the others (their stall reports name it); free() cancels it
        self.exit_notice = ExitNotice(self.cart)

    @classmethod
    def from_fortran(cls, handle, npolar=None, nazimuth=None, *, order="azimuth-fastest"):
        """Build a grid from a Fortran ``MPI_Comm`` handle (an integer).

        Use it when a Fortran model owns the communicator, passed through
        f2py, ctypes or a C shim as ``comm%MPI_VAL`` (``mpi_f08``) or the
        ``INTEGER`` handle (``mpif.h``/``use mpi``). The grid's communicators
        are new ones made from it: a Cartesian topology the handle may carry
        is not used, the ranks are laid out by ``order`` (see
        :class:`ProcessGrid`), and the model's own communicator is never
        freed by the grid.
        """
        handle = check_int(handle, "handle", "ProcessGrid.from_fortran")
        comm = MPI.Intracomm.f2py(handle)
        if comm == MPI.COMM_NULL:
            raise ValueError(f"ProcessGrid.from_fortran: handle {handle} is MPI_COMM_NULL")
        return cls(comm, npolar, nazimuth, order=order)

    def dup(self):
        """A grid of the same shape and order on duplicated communicators (collective).

        Give each thread that runs mpisphere operations its own grid: MPI
        matches the collectives of one communicator in call order, so two
        threads on one grid would mix their messages.
        """
        self._check_alive()
        parent = self.cart.Dup()  # row-major like cart, so the twin's positions are this grid's
        twin = ProcessGrid(parent, self.npolar, self.nazimuth)
        twin._owned.append(parent)
        twin.order, twin.comm_rank = self.order, self.comm_rank
        return twin

    # --- tiles ---------------------------------------------------------------

    def _check_extents(self, nlat, nlon, who):
        nlat = check_int(nlat, "nlat", f"ProcessGrid.{who}")
        nlon = check_int(nlon, "nlon", f"ProcessGrid.{who}")
        if nlat < self.npolar:
            raise ValueError(
                f"ProcessGrid.{who}: {self.npolar} polar ranks cannot split {nlat} latitudes "
                f"(every rank needs at least one); use at most {nlat} polar ranks")
        if nlon < self.nazimuth:
            raise ValueError(
                f"ProcessGrid.{who}: {self.nazimuth} azimuth ranks cannot split {nlon} longitudes "
                f"(every rank needs at least one); use at most {nlon} azimuth ranks")
        return nlat, nlon

    def lat_sizes(self, nlat):
        """Latitudes held by each polar rank (``split_sizes(nlat, npolar)``)."""
        return split_sizes(self._check_extents(nlat, self.nazimuth, "lat_sizes")[0], self.npolar)

    def lon_sizes(self, nlon):
        """Longitudes held by each azimuth rank (``split_sizes(nlon, nazimuth)``)."""
        return split_sizes(self._check_extents(self.npolar, nlon, "lon_sizes")[1], self.nazimuth)

    def tiling(self, nlat, nlon):
        """The :class:`~mpisphere.RegularTiling` of a regular ``(nlat, nlon)`` field on this grid.

        It says which tile each rank holds (``local_shape``, ``slices``) and
        moves whole fields of those extents (``scatter``, ``gather``), as
        :class:`~mpisphere.RingTiles` does for the rings of a reduced grid.
        Does not communicate.
        """
        return RegularTiling(self, nlat, nlon)

    def tile_slices(self, nlat, nlon, rank=None):
        """``(lat_slice, lon_slice)`` of grid rank ``rank``'s tile (default: this rank)."""
        nlat, nlon = self._check_extents(nlat, nlon, "tile_slices")
        rank = self.rank if rank is None else check_int(rank, "rank", "ProcessGrid.tile_slices")
        if not 0 <= rank < self.size:
            raise ValueError(f"ProcessGrid.tile_slices: rank {rank} out of range for {self.size} ranks")
        return self.tiling(nlat, nlon).slices(rank)

    def local_slices(self, nlat, nlon):
        """``(lat_slice, lon_slice)`` of this rank's tile of a ``(nlat, nlon)`` field."""
        return self.tile_slices(nlat, nlon)

    def local_shape(self, nlat, nlon):
        """``(h, w)``: this rank's tile of a ``(nlat, nlon)`` field."""
        lat, lon = self.local_slices(nlat, nlon)
        return lat.stop - lat.start, lon.stop - lon.start

    @collective
    def check_tile(self, nlat, nlon, lat, lon):
        """Collective check that a model's own tile on this rank is mpisphere's tile.

        Parameters
        ----------
        nlat, nlon : int
            The global grid.
        lat, lon : slice or (int, int)
            The model's tile on this rank: 0-based ``start, stop`` of its
            latitudes and longitudes (a Fortran model passes ``first - 1,
            last`` of its 1-based ranges).

        Raises
        ------
        ValueError
            On every rank when any rank's tile differs, naming each such rank
            with what it holds and what mpisphere expects there (a model that
            numbers its ranks another way needs ``order="polar-fastest"``).
        """
        self._check_alive()
        mine = self.tile_slices(nlat, nlon)
        try:
            given = tuple((int(t.start), int(t.stop)) if isinstance(t, slice) else tuple(int(v) for v in t)
                          for t in (lat, lon))
        except (TypeError, ValueError):
            given = None
        expected = ((mine[0].start, mine[0].stop), (mine[1].start, mine[1].stop))
        everyone = collectives.allgather_object(self.cart, (given, expected))
        wrong = [(r, g, e) for r, (g, e) in enumerate(everyone) if g != e]
        if wrong:
            def show(t):
                return "not a pair of (start, stop) ranges" if t is None else \
                    f"latitudes {t[0][0]}:{t[0][1]}, longitudes {t[1][0]}:{t[1][1]}"
            hint = ("; the tiles are mpisphere's tiles in another rank order: build the grid with "
                    f"order={'polar-fastest' if self.order == 'azimuth-fastest' else 'azimuth-fastest'!r}"
                    if sorted(g for _, g, _ in wrong if g) == sorted(e for _, _, e in wrong) else "")
            raise ValueError(f"ProcessGrid.check_tile: the model's tiles of the {nlat} x {nlon} field differ from "
                             f"mpisphere's on {len(wrong)} of {self.size} ranks: "
                             + "; ".join(f"rank {r} holds {show(g)}, expected {show(e)}" for r, g, e in wrong[:4])
                             + (f"; and {len(wrong) - 4} more ranks" if len(wrong) > 4 else "") + hint)

    # --- whole fields (I/O, tests) ----------------------------------------------

    @collective
    def scatter(self, field, root=0):
        """Cut a whole field on ``root`` into tiles, one per rank.

        Parameters
        ----------
        field : array, shape ``(..., nlat, nlon)``
            On ``root``: the whole field (NumPy or CuPy; any strides). On the
            other ranks it is ignored (pass ``None``).
        root : int
            Grid rank holding the field; the same on every rank.

        Returns
        -------
        array, shape ``(..., h, w)``
            This rank's tile, C-contiguous, in the field's array module
            (NumPy on ranks other than root unless they pass a CuPy array as
            ``field`` to say where the tile should live).

        Raises
        ------
        ValueError, TypeError, MemoryError
            On every rank, before any data moves: ranks that name different
            roots, a root out of range, root's field that cannot be scattered
            (not an array, fewer than 2 axes, an unsupported dtype, too small
            for the grid), or a tile that cannot be allocated on some rank.
        """
        return scatter_field(self, field, root)

    @collective
    def gather(self, tile, root=0):
        """Assemble the tiles of all ranks into the whole field on ``root``.

        Also assembles coefficient blocks: the block of a transform on this
        grid is a tile of the ``(lmax, mmax)`` array (degrees split over the
        polar axis, orders over the azimuth axis, in the contiguous layout),
        so ``grid.gather(sht.forward(x))`` is the whole coefficient array.
        A transform built with ``orders="balanced"`` holds other orders:
        use its ``gather_coefficients`` (which puts the columns in order).

        Parameters
        ----------
        tile : array, shape ``(..., h, w)``
            This rank's tile; leading shape and dtype equal on all ranks.
        root : int
            Grid rank that receives the field; the same on every rank.

        Returns
        -------
        array of shape ``(..., nlat, nlon)`` on ``root``, ``None`` elsewhere.

        Raises
        ------
        ValueError, TypeError, MemoryError
            On every rank, before any data moves: ranks that name different
            roots, tiles that do not fit together as the
            ``mpisphere.partition.split_sizes`` tiles of one field, or a
            field root cannot allocate.
        """
        return gather_tiles(self, tile, root, warn_balanced=True)

    @contextlib.contextmanager
    def holding(self, who):
        """Hold the grid's guard while a collective call that is not an operator communicates.

        What the operators do around every call, for the grid's own
        whole-field calls (:meth:`scatter`, :meth:`gather`) and for other
        layers that communicate on the grid (a store's reads and writes): a
        call from a second thread while one runs is refused on this rank,
        and on every other rank when the running call ends. ``who`` names
        the call in the error.
        """
        if self._freed and who != "ProcessGrid.free":  # free() is agreed: every rank raises this (free twice: a no-op)
            raise RuntimeError(f"ProcessGrid: used after free(); its communicators no longer exist ({who} on a grid "
                               "that was freed: make a new ProcessGrid)")

        def refusal():
            raise_everywhere(self.cart, who, InputError(REFUSED, RuntimeError))
        with guarded(self.guard, self.cart, who, refusal, settles=lambda: not self._freed):
            yield

    # --- housekeeping ---------------------------------------------------------------

    def _check_alive(self):
        check_alive(self)

    @property
    def freed(self):
        """True once :meth:`free` has run."""
        return self._freed

    @property
    def device_buffer_path(self):
        """One line: how device buffers reach MPI on this grid (CUDA-aware or staged), and why."""
        from .settings import config
        return cuda_aware.describe_path(*self.cuda_aware, force_staging=config.force_staging)

    @collective
    def free(self):
        """Free the communicators (collective). Safe to call twice.

        Operators built on the grid cannot be used afterwards: they raise.
        Like every collective call, ``free`` first agrees with the other
        ranks: a rank that frees the grid while another is in some other
        call on it (a transform made on some ranks only) raises on every
        rank, naming the calls, instead of leaving that rank waiting.
        """
        if self._freed:
            return
        error = None
        if not MPI.Is_finalized():
            # a free refused here (another rank is in another call) leaves the grid as it was, its failure notes
            # included: they are dropped only once every rank has agreed to free it
            Call(self.cart, "ProcessGrid.free").agree("ProcessGrid.free")
            # every rank frees the grid; one that answered its neighbours' halo calls while it waited here, or
            # that returned from a halo call that failed elsewhere (the agreement told it), raises once it has
            error = self.cart.failures.finding()
        self._freed = True
        self.exit_notice.cancel()
        if not MPI.Is_finalized():
            # freeing ends the grid's calls: a halo call that failed elsewhere is not raised any more (no rank can
            # be left waiting in a later call on this grid); every rank has sent its notes by now
            self.cart.failures.free()
        self.scratch.clear()
        if self.node_memory is not None:
            self.node_memory.free()
        if not MPI.Is_finalized():
            for comm in (self.azimuth, self.polar, self.cart, *self._owned):
                comm.Free()
        if error is not None:
            raise_finding(error, "ProcessGrid.free", self.rank, self.size, " (the grid is freed on every rank)")

    def __del__(self):
        if not getattr(self, "_freed", True) and not MPI.Is_finalized():
            warnings.warn(f"{self!r} was never freed: call grid.free() (collective) or use "
                          "'with ProcessGrid(...) as grid:'. Each grid holds three MPI communicators, and MPI "
                          "runs out of them (MPICH after about 680 grids).", ResourceWarning, stacklevel=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()
        return False

    def __repr__(self):
        if getattr(self, "npolar", None) is None:
            return "ProcessGrid(not constructed)"
        return (f"ProcessGrid({self.npolar} x {self.nazimuth}, rank {self.rank} at "
                f"(polar {self.polar_rank}, azimuth {self.azimuth_rank}))")
