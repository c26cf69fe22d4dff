"""One catalogue of operators and points for the tests that run every operator (staging, GPU).

``operators(grid)`` returns ``(operator, domain point)`` pairs covering every
public operator class: the primitives, the halo exchange and its adjoint, the
scalar and vector transforms (on regular and octahedral grids), the point
interpolation, the spectral calculus operators, the DISCO convolutions,
quadrature, spectral convolution and resampling, the two attentions (not
linear: ``op.linear`` is False, and the tests compare their forward and
``gradients`` instead of an adjoint), the algebra (``Identity``,
``Diagonal``, compositions, sums, scalings) and the shallow-water model's
tangent-linear model, on uneven extents; the points come from the operators'
own shape contract. ``test_the_catalogue_covers_every_public_operator`` fails
when a public operator class has no entry here.
"""

import numpy

from mpisphere import (CopyTo, Diagonal, DistributedInverseRealSHT, DistributedInverseRealVectorSHT,
                       DistributedRealSHT, DistributedRealVectorSHT, GatherFrom, GatherFromCopyTo, HaloExchange,
                       HaloReduce, Identity, PointInterpolation, ReduceFrom, ReduceScatter, RingGeometry, ScatterTo,
                       Transpose, calculus)
from mpisphere import (DistributedInverseReducedRealSHT, DistributedInverseReducedRealVectorSHT, RingTiles,
                       DistributedReducedRealSHT, DistributedReducedRealVectorSHT)
from mpisphere import (AttentionS2, DiscoConvS2, DiscoConvTransposeS2, NeighborhoodAttentionS2, QuadratureS2,
                       ResampleS2, SpectralConvS2)
from mpisphere.examples import ShallowWaterSolver
from mpisphere.spectral_convolution import spectral_truncation
from mpisphere.operators import DISTRIBUTED, Layout

from helpers import random_array, rank_rng

BATCH, NLAT, NLON = 5, 13, 10
SWE_NLAT, SWE_NLON = 12, 24  # the tangent-linear model's grid (Gauss): small, every grid of 1-6 ranks splits it


def host_only(op):
    """Operators that take host arrays only (the tangent-linear model's trajectory lives on the host; ducc0)."""
    return type(op).__name__ in ("TangentLinearModel", "LinearisedProducts") or \
        getattr(op, "legendre", None) == "table-free"


def attention(op, rng):
    """``op`` with its projections set (the same on every rank: ``rng`` draws alike everywhere)."""
    c, k, o = op.in_channels, op.k_channels, op.out_channels
    op.set_parameters(q_weights=rng.standard_normal((k, c)), k_weights=rng.standard_normal((k, c)),
                      v_weights=rng.standard_normal((o, c)), proj_weights=rng.standard_normal((o, o)),
                      q_bias=rng.standard_normal(k))
    return op


def operators(grid):
    """``[(op, x)]``: one point of each operator's domain (replicated points identical on every rank)."""
    az, pol = grid.azimuth, grid.polar
    local = rank_rng(grid.cart)
    same = numpy.random.default_rng(3)
    h, w = grid.local_shape(NLAT, NLON)
    sht, isht = DistributedRealSHT(grid, NLAT, NLON), DistributedInverseRealSHT(grid, NLAT, NLON)
    vsht, ivsht = DistributedRealVectorSHT(grid, NLAT, NLON), DistributedInverseRealVectorSHT(grid, NLAT, NLON)
    points = numpy.random.default_rng(11)  # the same points on every rank
    lats = points.uniform(-1.2, 1.2, 9)
    lons = points.uniform(0, 2 * numpy.pi, 9)
    tile_layout = Layout(DISTRIBUTED, grid.cart)
    octahedral = RingGeometry.octahedral(6)
    solver = ShallowWaterSolver(grid, SWE_NLAT, SWE_NLON, dt=150.0, quadrature="legendre-gauss")
    tangent_linear = solver.linearize(solver.random_initial_condition(), 2)
    lmax = spectral_truncation((NLAT, NLON), (NLAT, NLON))
    spectral_weight = same.standard_normal((1, 2, 3, lmax)) + 1j * same.standard_normal((1, 2, 3, lmax))
    spectral_bias = same.standard_normal((1, 2, lmax, lmax)) + 0j
    cases = [  # (operator, leading axes or a whole template for the primitives, dtype, random source)
        (Transpose(az, axes=(0, 2), extents=(BATCH, NLON)), (BATCH, h, None), numpy.float64, local),
        (Transpose(pol, axes=(-1, 1), extents=(w, NLAT)), (BATCH, None, None), numpy.complex128, local),
        (CopyTo(az), (3, 4), numpy.float64, same),
        (ReduceFrom(pol), (3, 4), numpy.float16, local),
        (ScatterTo(az, 1, 7), (3, None), numpy.float64, same),
        (GatherFrom(az, -1, 7), (3, None), numpy.float32, local),
        (ReduceScatter(pol, 0, 11), (None, 2), numpy.complex128, local),
        (GatherFromCopyTo(pol, 0, 11), (None, 2), numpy.float64, local),
        (HaloExchange(grid, 2, 2, extents=(NLAT, NLON)), (BATCH,), numpy.float64, local),
        (HaloReduce(grid, 1, 2, extents=(NLAT, NLON)), (BATCH,), numpy.float64, local),
        (sht, (2,), numpy.float64, local),
        (isht, (2,), numpy.complex128, local),
        (vsht, (2,), numpy.float64, local),
        (ivsht, (2,), numpy.complex128, local),
        # the other Legendre strategies: a polar Reduce_scatter (and its Allgatherv) instead of the transposes
        (DistributedRealSHT(grid, NLAT, NLON, legendre="reduce-scatter"), (2,), numpy.float64, local),
        (DistributedInverseRealVectorSHT(grid, NLAT, NLON, legendre="reduce-scatter"), (2,), numpy.complex128, local),
        (DistributedInverseRealSHT(grid, NLAT, NLON, legendre="table-free"), (2,), numpy.complex128, local),
        (DistributedRealVectorSHT(grid, NLAT, NLON, legendre="table-free"), (2,), numpy.float64, local),
        # on an octahedral grid: rings of their own lengths (every grid of 1-6 ranks splits O6)
        (DistributedReducedRealSHT(grid, octahedral), (2,), numpy.float64, local),
        (DistributedInverseReducedRealSHT(grid, octahedral, legendre="reduce-scatter"), (2,), numpy.complex128, local),
        (DistributedReducedRealVectorSHT(grid, octahedral, orders="balanced"), (2,), numpy.float64, local),
        (DistributedInverseReducedRealVectorSHT(grid, octahedral), (2,), numpy.complex128, local),
        (PointInterpolation(grid, NLAT, NLON, lats, lons), (2,), numpy.float64, local),
        (PointInterpolation(RingTiles(grid, octahedral), lats, lons), (2,), numpy.float64, local),
        (calculus.laplacian(sht, 2.0), (2,), numpy.complex128, local),
        (calculus.hyperdiffusion(isht, 600.0), (2,), numpy.complex128, local),
        (calculus.uv_to_vrtdiv(vsht, 2.0), (3,), numpy.float64, local),      # a composition with a scaling
        (calculus.vrtdiv_to_uv(ivsht, 2.0), (3,), numpy.complex128, local),
        (calculus.gradient(ivsht, 2.0), (3,), numpy.complex128, local),
        (calculus.laplacian(sht) - 0.5 * calculus.truncation(sht, 4), (2,), numpy.complex128, local),  # a sum
        (Identity(tile_layout, (h, w)), (2,), numpy.float64, local),
        (Diagonal(numpy.linspace(0.5, 1.5, h * w).reshape(h, w), tile_layout), (2,), numpy.float64, local),
        # the local operators: a DISCO convolution and its transpose, the integral, the spectral convolution,
        # the resampling
        (DiscoConvS2(grid, (NLAT, NLON), (NLAT, NLON), (3,), same.standard_normal((3, 2, 2))), (2,),
         numpy.float64, local),
        (DiscoConvTransposeS2(grid, (NLAT, NLON), (NLAT, NLON), (2, 2), same.standard_normal((2, 2, 3)),
                              basis_type="zernike"), (2,), numpy.float64, local),
        (QuadratureS2(grid, (NLAT, NLON)), (2,), numpy.float64, local),
        (SpectralConvS2(grid, (NLAT, NLON), (NLAT, NLON), spectral_weight, bias=spectral_bias), (2,),
         numpy.float64, local),
        (ResampleS2(grid, (NLAT, NLON), (NLAT + 4, 2 * NLON)), (2,), numpy.float64, local),
        # the attentions (not linear: the tests compare their forward and gradients instead of an adjoint)
        (attention(NeighborhoodAttentionS2(grid, 2, (NLAT, NLON), (NLAT, NLON), 2, theta_cutoff=0.6), same), (2,),
         numpy.float64, local),
        (attention(AttentionS2(grid, 2, (NLAT, NLON), (NLAT, NLON)), same), (2,), numpy.float64, local),
        (tangent_linear, (), tangent_linear.dtype, local),
        (tangent_linear.products[1], (2,), numpy.float64, local),  # its hand-linearised products
    ]
    return [(op, random_array(rng, op.domain_shape(lead), dtype)) for op, lead, dtype, rng in cases]
