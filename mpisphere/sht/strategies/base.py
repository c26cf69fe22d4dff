"""What a Legendre strategy is: the record every strategy fills in, and the stage shape of the own-latitude ones.

A transform's Legendre step can be spread over the polar ranks in more than
one way (:mod:`mpisphere.sht.strategies` lists them). Each way is one
``LegendreStrategy`` record in a file of its own, holding everything a
transform, the cost model and ``legendre="auto"`` need to know of it:

* how the polar ranks exchange (``polar_transposes``: two transposes, or a
  ``Reduce_scatter`` of every degree's partial sums and its adjoint);
* its tables (``LegendreStrategy.build_tables``) and its kernels, host
  and device, as a pipeline stage (``LegendreStrategy.stage``);
* whether it runs on device arrays, and whether it can run here at all
  (``LegendreStrategy.available``);
* its cost model: the largest table a rank holds
  (``LegendreStrategy.table_bytes``), the function values one field's
  contraction multiplies by (``LegendreStrategy.values``), and the
  modelled time of a batch's Legendre step on a
  ``mpisphere.sht.strategies.machine.MachineModel``
  (``LegendreStrategy.seconds``), which ``auto`` compares per batch.

A new strategy is one file with one such record, added to the registry's
tuple.
"""

import dataclasses
from typing import Any, Optional

import numpy

from ...operators import FORWARD, InputError
from ...partition import split_sizes
from ..orders import order_assignment
from ...stages.pipeline import LocalStage

__all__ = ["LegendreStrategy", "LegendreRequest", "OwnLatitudeStage", "row_entries", "triangle_entries"]


@dataclasses.dataclass(frozen=True)
class LegendreRequest:
    """What a transform asks of a strategy: the Legendre step of this rank, as the transform defines it.

    Attributes
    ----------
    kind : {"scalar", "vector"}
        The functions: ``P(l, m)`` in ``norm``, or the vector transforms'
        ``P(l, m) / sin(theta)`` (orthonormal, up to degree ``lmax``).
    lmax : int
        Degrees of the transform (the vector functions go one higher).
    orders : int array
        This rank's orders.
    theta : ndarray
        Every colatitude of the grid.
    own : slice
        This rank's latitudes (rows of ``theta``).
    npolar : int
        Polar ranks.
    norm : str
    csphase : bool
    synthesis : bool
        The tables of an inverse transform (the norm's synthesis factors).
    dtype, cdtype : numpy.dtype
        Real and complex dtypes.
    weights : ndarray or None
        ``2 pi`` times the quadrature weights at every latitude for an
        analysis; None for a synthesis.
    layout : Layout
        The transform's distributed layout (the stages' domain and range).
    contraction : str
        The ``contraction=`` method of the table products.
    """

    kind: str
    lmax: int
    orders: Any
    theta: Any
    own: slice
    npolar: int
    norm: str
    csphase: bool
    synthesis: bool
    dtype: Any
    cdtype: Any
    weights: Optional[Any]
    layout: Any
    contraction: str

    @property
    def vector(self):
        return self.kind == "vector"

    @property
    def nlat(self):
        return len(self.theta)

    @property
    def own_theta(self):
        return self.theta[self.own]

    def own_weights(self):
        """The weights of this rank's latitudes (None for a synthesis)."""
        return None if self.weights is None else self.weights[self.own]


def triangle_entries(lmax, orders, nlat, vector=False):
    """Table values held for ``orders`` at ``nlat`` latitudes, parity-split (northern half and equator).

    Scalar: degrees ``m .. lmax - 1`` per order. Vector: ``max(m, 1) .. lmax``.
    """
    n_north = nlat // 2
    n_half = n_north + nlat % 2
    top = lmax + 1 if vector else lmax
    total = 0
    for m in numpy.asarray(orders).tolist():
        start = max(m, 1) if vector else m
        rows = max(top - start, 0)
        total += ((rows + 1) // 2) * n_half + (rows // 2) * n_north
    return total


def row_entries(lmax, orders, nlat, vector=False):
    """Function values for ``orders`` at ``nlat`` latitudes without a parity split (one per degree and latitude)."""
    top = lmax + 1 if vector else lmax
    return nlat * sum(max(top - (max(m, 1) if vector else m), 0) for m in numpy.asarray(orders).tolist())


class LegendreStrategy:
    """One way of spreading a transform's Legendre step over the polar ranks (a registered record).

    Attributes
    ----------
    name : str
        What ``legendre=`` names it by.
    polar_transposes : bool
        True: a polar transpose gives every rank all latitudes of a share of
        the batch, and a second one splits the degrees. False: each rank
        contracts its own latitudes into every degree, and a
        ``Reduce_scatter`` over ``grid.polar`` completes the sums and splits
        the degrees (its adjoint, an ``Allgatherv``).
    runs_on_device : bool
        Whether its kernels take CuPy arrays.
    holds_tables : bool
        False: it evaluates its functions as it goes, so ``auto`` may run
        any batch of host arrays with it instead of the held tables'
        strategy, where the cost model says it is faster.
    summary : str
        One line for documentation and ``legendre_reason``.
    """

    name = None
    polar_transposes = True
    runs_on_device = True
    holds_tables = True
    summary = ""

    def available(self):
        """``(True, "")``, or ``(False, why and what to install)`` where it cannot run in this process."""
        return True, ""

    # --- what a transform asks of it ----------------------------------------------------------------------

    def build_tables(self, request):
        """This rank's tables for a :class:`LegendreRequest`, unweighted (shared by analysis and synthesis), or None."""
        raise NotImplementedError

    def stage(self, request, tables):
        """The Legendre step as a pipeline stage, ``(B, C, n_lat, m_loc) -> (B, C, L, m_loc)`` complex.

        ``n_lat``: every latitude (``polar_transposes``) or the rank's own;
        ``tables`` from :meth:`build_tables` (None for a batch of a strategy
        whose tables the transform does not hold).
        """
        raise NotImplementedError

    # --- its cost model (no MPI, no tables built) ---------------------------------------------------------

    def table_bytes(self, nlat, lmax, mmax, npolar, nazimuth, *, vector=False, dtype=numpy.float64,
                    orders="contiguous"):
        """The largest table a rank of the grid holds (bytes)."""
        raise NotImplementedError

    def values(self, lmax, orders, nlat, h, npolar, vector=False):
        """The function values one field's (one component's) contraction on a rank multiplies by.

        ``orders``: the rank's orders; ``nlat``: all latitudes, ``h``: the
        rank's own. What the contraction's arithmetic is proportional to.
        """
        raise NotImplementedError

    def fields_per_rank(self, padded, npolar, polar_rank):
        """How many of a padded batch's fields one rank contracts."""
        if self.polar_transposes:
            return split_sizes(padded, npolar)[polar_rank]
        return padded

    def seconds(self, model, nlat, lmax, mmax, npolar, nazimuth, batch, *, vector=False, dtype=numpy.float64,
                orders="contiguous", synthesis=False):
        """The modelled time of one call's Legendre step on the busiest rank (seconds), on ``model``.

        ``batch``: the transform's batch, padded as the transforms pad it;
        ``synthesis``: the kernels of an inverse transform. The comparison
        ``auto`` makes per batch of host arrays; the exchanges around it
        move about the same bytes for every strategy and are left out.
        """
        raise NotImplementedError

    def largest(self, nlat, lmax, mmax, npolar, nazimuth, orders, count):
        """The largest of ``count(mine, h)`` over the grid's ranks (their orders, their own latitudes)."""
        tallest = max(split_sizes(nlat, npolar))
        return max(count(mine, tallest) for mine in order_assignment(mmax, lmax, nazimuth, orders))

    def __repr__(self):
        return f"<Legendre strategy {self.name!r}>"


class OwnLatitudeStage(LocalStage):
    """Shapes and checks of a stage that contracts a rank's own latitudes: ``(B, C, h, m_loc) <-> (B, C, L, m_loc)``.

    A subclass sets ``nlat`` (the rank's latitudes), ``degrees``, ``orders``
    and ``dtype`` (complex).
    """

    def _output(self, direction, spec):
        n_in, n_out = (self.nlat, self.degrees) if direction == FORWARD else (self.degrees, self.nlat)
        count = len(self.orders)
        if len(spec.shape) != 4 or spec.shape[2:] != (n_in, count) or spec.dtype != self.dtype:
            raise InputError(f"expected (B, C, {n_in}, {count}) {self.dtype.name}, got {spec.shape} {spec.dtype.name}")
        return spec.but(shape=spec.shape[:2] + (n_out, count)), spec.describe()

    def _shapes(self, lead):
        return lead + (self.nlat, len(self.orders)), lead + (self.degrees, len(self.orders))
