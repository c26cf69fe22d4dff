"""Global inner products of distributed and replicated arrays, and the dot test of an adjoint."""


import numpy

from .. import backend, collectives
from ..agreement import Call
from .base import domain_dtype
from .layout import REPLICATED



# --- inner products and the dot test ------------------------------------------------------------

def _local_inner(a, b):
    """``sum(real(conj(a) * b))`` and ``sum(|a| |b|)`` of this rank's arrays, in float64 (and an error)."""
    if not (backend.is_array(a) and backend.is_array(b)):
        return 0.0, 0.0, f"inner product of {type(a).__name__} and {type(b).__name__}: arrays expected"
    if tuple(a.shape) != tuple(b.shape):
        return 0.0, 0.0, f"inner product of arrays of different shapes {tuple(a.shape)} and {tuple(b.shape)}"
    a = a.reshape(-1)
    b = b.reshape(-1)
    wide = numpy.complex128 if a.dtype.kind == "c" or b.dtype.kind == "c" else numpy.float64
    a = a.astype(wide, copy=False)
    b = b.astype(wide, copy=False)
    # vdot conjugates its first argument: real(vdot(a, b)) = sum(real(conj(a) * b))
    value = float(numpy.vdot(a, b).real)
    if wide is numpy.complex128:
        # |re(conj(a_i) b_i)| <= |a_i.re b_i.re| + |a_i.im b_i.im|: the bound of what is summed
        bound = float(numpy.vdot(abs(a.real), abs(b.real)) + numpy.vdot(abs(a.imag), abs(b.imag)))
    else:
        bound = float(numpy.vdot(abs(a), abs(b)))
    return value, bound, None


def _global_sums(a, b, layout, who):
    """Global ``(inner product, bound)`` of ``a`` and ``b`` in ``layout``; a local problem raises everywhere."""
    value, bound, error = _local_inner(a, b)
    weight = 1.0 if layout.counts_here() else 0.0
    local = numpy.array([value * weight, bound * weight, 0.0 if error is None else 1.0])
    if layout.space.Get_size() > 1:
        local = collectives.allreduce_floats(layout.space, local)
    if local[2] > 0:
        raise ValueError(f"{who}: " + (error or "another rank's arrays do not match for the inner product"))
    return float(local[0]), float(local[1])


def inner(a, b, layout):
    """Global real inner product of ``a`` and ``b`` held in ``layout``.

    ``sum(real(conj(a) * b))`` over every element of every rank's piece
    (each copy of a replicated array counted once), accumulated in float64
    whatever the dtype. Collective over ``layout.space`` when it has more
    than one rank; arrays of different shapes on any rank raise on all.
    """
    return _global_sums(a, b, layout, "inner")[0]


def _random_point(rng, shape, dtype, layout, seed):
    """Random normal data; identical on the ranks of a replicated layout's communicator."""
    if layout.kind == REPLICATED:
        rng = numpy.random.default_rng([seed, 0])
    dtype = numpy.dtype(dtype)
    x = rng.standard_normal(shape)
    if dtype.kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def dottest(op, x=None, y=None, rtol=1e-13, *, lead=(), dtype=None, seed=0):
    """Check ``<op.forward(x), y> == <x, op.adjoint(y)>`` over all ranks.

    The two inner products are equal in exact arithmetic; computed, each
    differs from its exact value by at most about ``n * eps`` times the sum
    of the absolute values of its terms, ``sum |(A x)_i| |y_i|`` and
    ``sum |x_i| |(A^H y)_i|``, whatever order the sum is taken in. The
    difference is therefore measured against that bound, never against the
    inner products themselves: those can cancel to almost nothing (a sum of
    a million terms of size one that comes to 31), and then the verdict
    would flip with the summation order of the CPU's kernels.

    Parameters
    ----------
    op : LinearOperator
    x : array, optional
        A point of the domain (this rank's piece, or the replicated array).
        Drawn at random from ``op.domain_shape(lead)`` when omitted.
    y : array, optional
        A point of the range; drawn at random like ``op.forward(x)`` when
        omitted.
    rtol : float
        Largest accepted ``|<A x, y> - <x, A^H y>| / (sum |A x| |y| + sum |x| |A^H y|)``.
    lead : tuple of int, keyword-only
        Leading axes of the random points.
    dtype : dtype, optional, keyword-only
        Of a random ``x`` (a random ``y`` takes the dtype of ``op.forward(x)``):
        by default the dtype the operator takes where it fixes one (the
        transforms: real fields or complex coefficients, as built), else
        float64.
    seed : int, keyword-only
        Seed of the random points (mixed with the rank for distributed ones).

    Returns
    -------
    float
        That ratio, the same on every rank.

    Raises
    ------
    AssertionError
        If the ratio exceeds ``rtol``; the message holds both inner products,
        the bound and the ratio.
    """
    space = op.domain.space
    who = f"dottest({op.name})"
    dtype = domain_dtype(op, dtype)
    if space.Get_size() > 1:  # one verdict for every rank: the ranks check the same thing, to the same tolerance
        call = Call(space, who)
        if not (isinstance(rtol, (int, float, numpy.integer, numpy.floating)) and not isinstance(rtol, bool)):
            call.fail(f"rtol must be a real number, got {rtol!r}", TypeError)
        # the operator itself agrees in its own calls (copies on sub-communicators may differ between groups)
        call.agree(f"{who}: rtol={rtol!r}, lead={tuple(lead)!r}, dtype={numpy.dtype(dtype).name}, seed={seed!r}, "
                   f"x={'given' if x is not None else 'drawn'}, y={'given' if y is not None else 'drawn'}")
    rng = numpy.random.default_rng([seed, space.Get_rank(), space.Get_size()])
    if x is None:
        x = _random_point(rng, op.domain_shape(lead), dtype, op.domain, seed)
    ax = op.forward(x)
    if y is None:
        y = backend.array_module(ax).asarray(_random_point(rng, ax.shape, ax.dtype, op.range, seed + 1))
    aty = op.adjoint(y)
    lhs, lhs_bound = _global_sums(ax, y, op.range, who)
    rhs, rhs_bound = _global_sums(x, aty, op.domain, who)
    if space.Get_size() > 1:  # an Allreduce may round differently on different ranks: rank 0's figures for all
        lhs, rhs, lhs_bound, rhs_bound = (float(v) for v in collectives.bcast_floats(
            space, numpy.array([lhs, rhs, lhs_bound, rhs_bound], dtype=numpy.float64)))
    bound = lhs_bound + rhs_bound
    error = abs(lhs - rhs) / bound if bound > 0 else 0.0
    if not error <= rtol:
        raise AssertionError(
            f"dottest({op.name}): <A x, y> = {lhs!r} but <x, A^H y> = {rhs!r}; their difference "
            f"{abs(lhs - rhs):.3e} is {error:.3e} of the rounding bound sum|Ax||y| + sum|x||A^H y| = {bound:.6e}, "
            f"more than rtol {rtol:.1e}")
    return error
