"""The neighbourhoods of neighbourhood attention on the sphere as arcs of input rings (no MPI).

torch-harmonics 0.9.3's ``NeighborhoodAttentionS2`` lets an output point
attend the input points within ``theta_cutoff`` of it (the support of a
zero-order Zernike DISCO filter: ``disco.psi`` builds it, with the same
widened cutoff). Its neighbourhoods are discs, so on each input ring they are
one arc of consecutive longitudes (or the whole ring, near the poles). This
module writes them so:

``(ho, phase, hi) -> (first, length)``: the output points of latitude ``ho``
whose longitude index ``wo`` is ``phase`` modulo ``period`` attend, on input
ring ``hi``, the ``length`` longitudes ``anchor(wo) + first + t`` (modulo
``nlon_in``, ``t < length``), with ``anchor(wo) = step * (wo // period)``.

* self-attention and down-sampling (``nlon_in`` a multiple of ``nlon_out``,
  torch-harmonics' gather form): one phase, ``step = nlon_in // nlon_out``;
* up-sampling (``nlon_out`` a multiple of ``nlon_in``, its scatter form):
  ``period = nlon_out // nlon_in`` phases, ``step = 1``.

Consecutive output points of one phase then read windows of input longitudes
``step`` apart: a strided view of a row held in ring order, with no gather.
"""

import dataclasses

import numpy

from ..disco.bases import filter_basis
from ..disco.psi import convolution_tensor, default_theta_cutoff

__all__ = ["Arcs", "neighbourhood_arcs", "default_attention_cutoff"]


def default_attention_cutoff(in_shape, out_shape, quadrature_in="equiangular", quadrature_out="equiangular"):
    """torch-harmonics' default ``theta_cutoff``: one latitude gap of the coarser grid (the input's up-sampling)."""
    if _upsampling(in_shape, out_shape):
        return default_theta_cutoff(in_shape[0], quadrature_in)
    return default_theta_cutoff(out_shape[0], quadrature_out)


def _upsampling(in_shape, out_shape):
    return out_shape[1] % in_shape[1] == 0 and in_shape[1] % out_shape[1] != 0


@dataclasses.dataclass(frozen=True)
class Arcs:
    """Every output latitude's neighbourhood as arcs of input rings (see the module docstring).

    Attributes
    ----------
    in_shape, out_shape : (int, int)
    period, step : int
        Phases of the output longitudes, and the input longitudes between
        consecutive output points of one phase.
    rows : list of list of list of (int, int, int)
        ``rows[ho][phase]``: the ``(hi, first, length)`` of each input ring
        the phase's points of latitude ``ho`` reach, ``hi`` ascending.
    """

    in_shape: tuple
    out_shape: tuple
    period: int
    step: int
    rows: list

    def anchor(self, wo):
        """The input longitude ``anchor(wo)`` of output longitude ``wo`` (int or array)."""
        return self.step * (numpy.asarray(wo) // self.period)

    def pairs(self):
        """The number of (output point, input point) pairs: the neighbourhoods' sizes summed over the sphere."""
        nlon_out = self.out_shape[1]
        return sum(sum(length for _, _, length in arcs) * len(range(phase, nlon_out, self.period))
                   for per_row in self.rows for phase, arcs in enumerate(per_row))


def _arc(offsets, n):
    """``offsets`` (modulo ``n``) as ``(first, length)`` of consecutive values, ``first`` in ``(-n/2, n/2]``."""
    offsets = numpy.unique(numpy.mod(offsets, n))
    if offsets.size == n:
        return -((n - 1) // 2), n
    gaps = numpy.diff(numpy.concatenate([offsets, [offsets[0] + n]]))
    start = int(offsets[(int(numpy.argmax(gaps)) + 1) % offsets.size])
    first = start - n if start > n // 2 else start
    if not numpy.array_equal(numpy.sort(numpy.mod(first + numpy.arange(offsets.size), n)), offsets):
        raise ValueError("a neighbourhood that is not an arc of its ring")   # a disc never gives one
    return first, int(offsets.size)


def neighbourhood_arcs(in_shape, out_shape, quadrature_in="equiangular", quadrature_out="equiangular",
                       theta_cutoff=None):
    """The neighbourhoods of torch-harmonics' ``NeighborhoodAttentionS2`` as :class:`Arcs`.

    Parameters
    ----------
    in_shape, out_shape : (int, int)
        ``(nlat, nlon)`` of the key/value and the query grids; one ``nlon``
        a multiple of the other.
    quadrature_in, quadrature_out : str
    theta_cutoff : float or None
        Radians; None: :func:`default_attention_cutoff`.

    Returns
    -------
    Arcs
    """
    (nlat_in, nlon_in), (nlat_out, nlon_out) = in_shape, out_shape
    cutoff = default_attention_cutoff(in_shape, out_shape, quadrature_in, quadrature_out) if theta_cutoff is None \
        else theta_cutoff
    basis = filter_basis(1, "zernike")
    if _upsampling(in_shape, out_shape):
        # psi from the output grid to the input grid: input ring hi reaches output points (ho, wo' + period * wi)
        period = nlon_out // nlon_in
        psi = convolution_tensor(basis, out_shape, in_shape, quadrature_out, quadrature_in, cutoff, "none",
                                 transpose_normalization=True)
        reached = [[dict() for _ in range(period)] for _ in range(nlat_out)]
        e = numpy.arange(nlon_in)
        for hi in range(nlat_in):
            mine = psi.out_row == hi
            for ho in numpy.unique(psi.in_row[mine]):
                arc = numpy.zeros(nlon_out, dtype=bool)
                arc[psi.in_col[mine & (psi.in_row == ho)]] = True
                for phase in range(period):
                    found = e[arc[numpy.mod(phase - period * e, nlon_out)]]
                    if found.size:
                        reached[ho][phase][hi] = _arc(found, nlon_in)
        rows = [[[(hi,) + per_phase[hi] for hi in sorted(per_phase)] for per_phase in per_row] for per_row in reached]
        return Arcs(tuple(in_shape), tuple(out_shape), period, 1, rows)
    if nlon_in % nlon_out:
        raise ValueError(f"one of nlon_in={nlon_in} and nlon_out={nlon_out} must be a multiple of the other")
    psi = convolution_tensor(basis, in_shape, out_shape, quadrature_in, quadrature_out, cutoff, "none")
    rows = []
    for ho in range(nlat_out):
        mine = psi.out_row == ho
        arcs = [(int(hi),) + _arc(psi.in_col[mine & (psi.in_row == hi)], nlon_in)
                for hi in numpy.unique(psi.in_row[mine])]
        rows.append([arcs])
    return Arcs(tuple(in_shape), tuple(out_shape), 1, nlon_in // nlon_out, rows)
