"""What one transform costs each rank: table bytes, arithmetic, bytes and messages sent (no MPI).

The counts follow the code, not an idealisation: tables as
:mod:`mpisphere.sht.tables` stores them (parity-split, northern half), the
batch padded to the grid as the transforms pad it, and every transpose's
Alltoallv as :class:`~mpisphere.Transpose` posts it. The tests check the
table counts against built transforms and the transpose counts against the
bytes handed to MPI in real runs; ``scripts/scaling_model.py`` and
docs/scaling.md build a time model on them.
"""

import collections
import math
import os

import numpy

from ..partition import split_sizes
from ..validation import check_choice, check_int
from .orders import order_assignment
from .strategies import NAMES, STRATEGIES, strategy
from .strategies.base import row_entries, triangle_entries

__all__ = ["table_entries", "row_table_entries", "RankCost", "sht_costs", "LEGENDRE_STRATEGIES",
           "legendre_table_bytes", "choose_legendre", "resolve_legendre", "batch_candidates", "choose_for_batch",
           "default_table_budget", "ring_memory"]

TRANSPOSES = ("longitudes", "orders", "latitudes", "degrees")

LEGENDRE_STRATEGIES = NAMES
"""How a transform's Legendre step is spread over the polar ranks (:mod:`mpisphere.sht.strategies`)."""

table_entries = triangle_entries
row_table_entries = row_entries


def legendre_table_bytes(strategy_name, nlat, lmax, mmax, npolar, nazimuth, *, vector=False, dtype=numpy.float64,
                         orders="contiguous"):
    """The largest table a rank of the grid holds with the strategy ``strategy_name`` (bytes).

    ``"transpose"``: each rank's orders at every latitude, parity-split;
    ``"reduce-scatter"``: its orders at its own latitudes, whole (parity-split
    on one polar rank, where they are all of them); ``"table-free"``: 0.
    """
    return strategy(strategy_name).table_bytes(nlat, lmax, mmax, npolar, nazimuth, vector=vector, dtype=dtype,
                                               orders=orders)


def default_table_budget():
    """Half this machine's memory per CPU core (bytes): what ``legendre="auto"`` lets one rank's tables take.

    The same on every rank of a machine where the nodes are alike; a
    transform's resolved strategy is part of what its calls agree on, so
    unlike nodes that resolve differently raise instead of hanging.
    """
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 30
    return memory // (2 * max(os.cpu_count() or 1, 1))


def _megabytes(nbytes):
    return f"{nbytes / 1e6:.1f} MB"


def choose_legendre(nlat, lmax, mmax, npolar, nazimuth, *, vector=False, dtype=numpy.float64, orders="contiguous",
                    budget=None):
    """The strategy whose tables ``legendre="auto"`` builds: ``(record, why)``, by memory.

    The first strategy of the registry (:data:`~mpisphere.sht.strategies.STRATEGIES`, in the order ``auto``
    prefers them) that can run here and whose largest table on a rank fits ``budget``; where none does, the
    one with the smallest tables. With the registry as it stands: the transpose whenever its tables fit (the
    fastest for many fields, and on a GPU), else the reduce-scatter if its own-latitude tables (which shrink
    with every polar rank) fit, else the table-free one (ducc0 installed). Per batch, ``auto`` may still run
    a batch with a strategy that holds no tables (:func:`choose_for_batch`).
    """
    budget = default_table_budget() if budget is None else budget
    options = dict(vector=vector, dtype=dtype, orders=orders)
    too_big = []
    for record in STRATEGIES:
        if not record.available()[0]:
            continue
        size = record.table_bytes(nlat, lmax, mmax, npolar, nazimuth, **options)
        if size <= budget:
            found = f"{record.name} tables of {_megabytes(size)} per rank fit {budget / 1e6:.0f} MB" \
                if record.holds_tables else f"{record.name} holds no tables"
            return record, "; ".join([f"{r.name} tables of {_megabytes(n)} exceed {budget / 1e6:.0f} MB"
                                      for r, n in too_big] + [found])
        too_big.append((record, size))
    record, size = min(too_big, key=lambda pair: pair[1])   # the first of the smallest
    return record, f"no strategy's tables fit {budget / 1e6:.0f} MB; the smallest tables ({record.name}, " \
                   f"{_megabytes(size)})"


def resolve_legendre(legendre, budget, nlat, lmax, mmax, npolar, nazimuth, *, vector, dtype, orders, who):
    """A transform's ``legendre=`` and ``max_table_bytes=`` checked and resolved: ``(record, why)``.

    Raises for a strategy that cannot run in this process (``ImportError``, saying what to install) or a
    budget given with a named strategy, naming ``who``.
    """
    legendre = check_choice(legendre, ("auto",) + LEGENDRE_STRATEGIES, "legendre", who)
    if budget is not None:
        budget = check_int(budget, "max_table_bytes", who, minimum=0)
        if legendre != "auto":
            raise ValueError(f"{who}: max_table_bytes is the budget legendre='auto' chooses by; "
                             f"legendre={legendre!r} does not use it")
    if legendre == "auto":
        return choose_legendre(nlat, lmax, mmax, npolar, nazimuth, vector=vector, dtype=dtype, orders=orders,
                               budget=budget)
    record = strategy(legendre)
    runs, why = record.available()
    if not runs:
        raise ImportError(f"{who}: {why}")
    return record, "chosen"


def batch_candidates(held, device=False):
    """The strategies ``auto`` may run a batch with: the held tables' (a record) and, for host arrays, those
    that hold no tables and can run here."""
    return (held,) + tuple(record for record in STRATEGIES
                           if record is not held and not record.holds_tables and record.available()[0]
                           and (record.runs_on_device or not device))


def choose_for_batch(held, model, nlat, lmax, mmax, npolar, nazimuth, batch, *, vector=False,
                     dtype=numpy.float64, orders="contiguous", synthesis=False, device=False):
    """The strategy ``legendre="auto"`` runs one batch with: ``(record, why)``.

    ``held``: the record whose tables the transform holds
    (:func:`choose_legendre`). A batch runs with it or with a strategy that
    holds no tables (:func:`batch_candidates`), whichever the cost model on
    ``model`` (:class:`~mpisphere.sht.strategies.MachineModel`) gives the
    shorter Legendre step: a table product reads the whole table for a few
    fields' work, while ducc0's recurrence costs the same per field. On a
    device, those whose kernels take device arrays. ``batch``: the fields
    (vector fields count once), padded as the transforms pad them;
    ``synthesis``: an inverse transform's kernels.
    """
    candidates = batch_candidates(held, device)
    if len(candidates) == 1:
        return held, "device arrays: the held tables' strategy" if device else "the only candidate"
    options = dict(vector=vector, dtype=dtype, orders=orders, synthesis=synthesis)
    times = {record: record.seconds(model, nlat, lmax, mmax, npolar, nazimuth, batch, **options)
             for record in candidates}
    best = min(times, key=lambda record: (times[record], STRATEGIES.index(record)))
    against = " and ".join(f"{times[r] * 1e3:.3g} ms with {r.name}" for r in candidates if r is not best)
    return best, f"{batch} field(s): modelled Legendre step {times[best] * 1e3:.3g} ms with {best.name} against " \
                 f"{against}"



class RankCost(collections.namedtuple(
        "RankCost", "rank polar_rank azimuth_rank table_bytes scratch_bytes legendre_multiply_adds fft_flops sent "
                    "messages legendre_values", defaults=(0,))):
    """One rank's cost of one forward (or inverse: the same counts, reversed) transform.

    Attributes
    ----------
    table_bytes : int
        Legendre tables held (an analysis and a synthesis on one grid share them).
    scratch_bytes : int
        The grid's pipeline buffers, each the size of the largest
        intermediate of the transform (shared by the transforms of a grid):
        two, or one for a scalar transform on one rank, where the Legendre
        step runs in place and the FFTs read and write its layout.
    legendre_multiply_adds : int
        Real multiply-adds of the contraction (the table times the real and
        imaginary columns of every field this rank contracts), one per
        stored table entry: an upper bound on the host, whose contraction
        skips the polar entries that are negligible (about 12% of them at
        ``lmax = nlat = 361``; see :class:`~mpisphere.sht.tables.LegendreTables`).
    fft_flops : float
        ``2.5 n log2 n`` per real FFT of ``n = nlon`` points, for the rows
        this rank transforms.
    sent : tuple of 4 int
        Bytes this rank sends to other ranks in each transpose, in pipeline
        order: ``longitudes``, ``orders``, ``latitudes``, ``degrees``.
    messages : tuple of 4 int
        Non-empty messages to other ranks in each transpose.
    legendre_values : int
        The function values the contraction multiplies by: the table
        entries, or (``"table-free"``) the values computed on the fly. Its
        multiply-adds over these values is the contraction's real column
        count, which decides its speed.

    With ``legendre="reduce-scatter"`` or ``"table-free"`` the third
    exchange (``latitudes``) is empty and the fourth (``degrees``) is the
    polar ``Reduce_scatter`` of every degree's partial sums.
    """

    __slots__ = ()


def sht_costs(nlat, nlon, lmax, mmax, npolar, nazimuth, *, batch=1, vector=False, dtype=numpy.float64,
              orders="contiguous", legendre="transpose"):
    """Per-rank costs of one transform of ``batch`` fields on an ``npolar x nazimuth`` grid.

    ``legendre`` is the transform's strategy (one of
    :data:`LEGENDRE_STRATEGIES`, resolved: not ``"auto"``).

    Returns
    -------
    list of :class:`RankCost`, one per grid rank (row-major: ``rank =
    polar_rank * nazimuth + azimuth_rank``).
    """
    real = numpy.dtype(dtype)
    complex_size = 2 * real.itemsize
    components = 2 if vector else 1
    padded = max(batch, npolar, nazimuth)  # the transforms pad the batch to split it over both axes
    lat_sizes, lon_sizes = split_sizes(nlat, npolar), split_sizes(nlon, nazimuth)
    degree_sizes = split_sizes(lmax, npolar)
    batch_azimuth, batch_polar = split_sizes(padded, nazimuth), split_sizes(padded, npolar)
    assignment = order_assignment(mmax, lmax, nazimuth, orders)
    fft_per_row = 2.5 * nlon * math.log2(nlon) if nlon > 1 else 0.0
    # every stage but the in-place Legendre step writes the other buffer; a transform on one rank has one such
    # stage in each direction (the forward FFT; the inverse's copy from the caller's layout, or the vector
    # coupling, which reads and writes the caller's layout itself)
    slots = 1 if npolar == nazimuth == 1 else 2
    # per azimuth rank (and tile height) once: a grid of thousands of ranks has few distinct ones
    record = strategy(legendre)
    holds_tables = record.table_bytes(nlat, lmax, mmax, npolar, nazimuth, vector=vector) > 0
    transpose_entries = [table_entries(lmax, mine, nlat, vector) for mine in assignment]
    row_entries_of = {}
    costs = []
    for p in range(npolar):
        for a in range(nazimuth):
            h, w, m_loc = lat_sizes[p], lon_sizes[a], len(assignment[a])
            entries = transpose_entries[a]
            cells = components * h
            sent = (
                # (B, C, h, w) -> (Ba, C, h, nlon): my longitudes of the other ranks' batch shares
                (padded - batch_azimuth[a]) * cells * w * real.itemsize,
                # (Ba, C, h, mmax) -> (B, C, h, m): my batch share of the other ranks' orders
                batch_azimuth[a] * cells * (mmax - m_loc) * complex_size,
                # (B, C, h, m) -> (Bp, C, nlat, m): my latitudes of the other ranks' batch shares
                (padded - batch_polar[p]) * cells * m_loc * complex_size,
                # (Bp, C, L, m) -> (B, C, l, m): my batch share of the other ranks' degrees
                batch_polar[p] * components * (lmax - degree_sizes[p]) * m_loc * complex_size,
            )
            messages = (
                sum(1 for q in range(nazimuth) if q != a and batch_azimuth[q] * h * w > 0),
                sum(1 for q in range(nazimuth) if q != a and batch_azimuth[a] * h * len(assignment[q]) > 0),
                sum(1 for q in range(npolar) if q != p and batch_polar[q] * h * m_loc > 0),
                sum(1 for q in range(npolar) if q != p and batch_polar[p] * degree_sizes[q] * m_loc > 0),
            )
            ba, bp = batch_azimuth[a], batch_polar[p]
            intermediates = (  # elements, and their sizes: every boundary of the forward pipeline
                padded * cells * w * real.itemsize, ba * cells * nlon * real.itemsize,
                ba * cells * (nlon // 2 + 1) * complex_size, padded * cells * m_loc * complex_size,
                bp * components * nlat * m_loc * complex_size,
                bp * components * (lmax + 1 if vector else lmax) * m_loc * complex_size,
                padded * components * degree_sizes[p] * m_loc * complex_size)
            values, contracted = entries, batch_polar[p]
            if not record.polar_transposes:
                # own latitudes into every degree for the whole batch; the degrees' partial sums reduce-scattered
                if (h, a) not in row_entries_of:
                    row_entries_of[h, a] = record.values(lmax, assignment[a], nlat, h, npolar, vector)
                values, contracted = row_entries_of[h, a], padded
                entries = values if holds_tables else 0
                sent = sent[:2] + (0, padded * components * (lmax - degree_sizes[p]) * m_loc * complex_size)
                messages = messages[:2] + (0, sum(1 for q in range(npolar) if q != p and degree_sizes[q] * m_loc > 0))
                intermediates = intermediates[:4] + (padded * components * (lmax + 1 if vector else lmax) * m_loc
                                                     * complex_size,)
            costs.append(RankCost(
                rank=p * nazimuth + a, polar_rank=p, azimuth_rank=a,
                table_bytes=entries * real.itemsize, scratch_bytes=slots * max(intermediates),
                legendre_multiply_adds=values * 2 * components * contracted,
                fft_flops=fft_per_row * batch_azimuth[a] * cells,
                sent=sent, messages=messages, legendre_values=values))
    return costs


def ring_memory(rings, lmax, mmax, npolar, nazimuth, *, batch=1, vector=False, dtype=numpy.float64,
                orders="contiguous", legendre="transpose"):
    """Per-rank bytes of a forward and an inverse transform on a ring grid, an upper bound (no MPI).

    Parameters
    ----------
    rings : RingGeometry
    lmax, mmax, npolar, nazimuth, batch, vector, dtype, orders, legendre
        As the transforms take them (``legendre`` resolved).

    Returns
    -------
    list of dict, one per grid rank (row-major)
        ``tables`` (the Legendre tables, shared by the two transforms),
        ``pipeline`` (the grid's two buffers of the largest intermediate),
        ``fourier`` (the ring stage's whole rings, received and sent points,
        one spectrum and the orders in C order), ``transposes`` (the packed
        send and receive buffers of the other exchanges) and ``total``;
        the caller's input and output are not counted.
    """
    from ..rings import balanced_ring_split
    real = numpy.dtype(dtype)
    complex_size = 2 * real.itemsize
    c = 2 if vector else 1
    padded = max(batch, npolar, nazimuth)
    ring_counts = balanced_ring_split(rings.nlon, npolar)
    starts = numpy.concatenate([[0], numpy.cumsum(ring_counts)])
    batch_azimuth, batch_polar = split_sizes(padded, nazimuth), split_sizes(padded, npolar)
    degree_sizes = split_sizes(lmax, npolar)
    assignment = order_assignment(mmax, lmax, nazimuth, orders)
    record = strategy(legendre)
    holds_tables = record.table_bytes(rings.nrings, lmax, mmax, npolar, nazimuth, vector=vector) > 0
    degrees = lmax + 1 if vector else lmax
    out = []
    for p in range(npolar):
        nlon = rings.nlon[starts[p]:starts[p + 1]]
        h, row = len(nlon), int(nlon.sum())
        for a in range(nazimuth):
            points = sum(split_sizes(int(n), nazimuth)[a] for n in nlon)
            m_loc, ba, bp = len(assignment[a]), batch_azimuth[a], batch_polar[p]
            if record.polar_transposes:
                tables = triangle_entries(lmax, assignment[a], rings.nrings, vector)
                after = (bp * c * rings.nrings * m_loc, bp * c * degrees * m_loc, padded * c * degree_sizes[p] * m_loc)
            else:
                tables = record.values(lmax, assignment[a], rings.nrings, h, npolar, vector) if holds_tables else 0
                after = (padded * c * degrees * m_loc,)
            spectra = [padded * c * points * real.itemsize] + [n * complex_size for n in (
                ba * c * h * mmax, padded * c * h * m_loc) + after]
            longest = max(int(n) // 2 + 1 for n in nlon)
            fourier = 3 * ba * c * row * real.itemsize + ba * c * 2 * longest * complex_size + \
                ba * c * h * mmax * complex_size
            exchanges = [(ba * c * h * mmax, padded * c * h * m_loc)] + (
                [(padded * c * h * m_loc, bp * c * rings.nrings * m_loc), (bp * c * lmax * m_loc,
                                                                           padded * c * degree_sizes[p] * m_loc)]
                if record.polar_transposes else [(padded * c * lmax * m_loc, padded * c * degree_sizes[p] * m_loc)])
            transposes = sum((i + o) * complex_size for i, o in exchanges) if npolar * nazimuth > 1 else 0
            pipeline = (1 if npolar == nazimuth == 1 else 2) * max(spectra)
            item = {"tables": tables * real.itemsize, "pipeline": pipeline, "fourier": fourier,
                    "transposes": transposes}
            item["total"] = sum(item.values())
            out.append(item)
    return out
