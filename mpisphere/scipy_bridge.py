"""An operator on one rank as a ``scipy.sparse.linalg.LinearOperator`` (SciPy imported when called).

:func:`~mpisphere.aslinearoperator` hands any :class:`~mpisphere.LinearOperator` whose
ranks are a single process to SciPy's iterative solvers and algebra:
``matvec`` is ``forward`` and ``rmatvec`` is ``adjoint``, on flattened
arrays. mpisphere's adjoints are taken in the real inner product, in which
a complex array counts as the pair of its real and imaginary parts; so the
SciPy operator is real and sees every complex array as its ``(re, im)``
pairs, ``2 n`` real numbers. Its dot product is then mpisphere's inner
product, and ``.H`` (``rmatvec``) is the exact adjoint, also for the real
transforms that map real fields to complex coefficients (which are not
complex-linear maps SciPy could hold as complex matrices).
"""

import math

import numpy

from . import dtypes
from .operators import LinearOperator
from .operators import domain_dtype as operator_domain_dtype

__all__ = ["aslinearoperator", "as_pairs", "from_pairs", "pairs_size"]


def pairs_size(shape, dtype):
    """Real numbers in an array of ``shape`` and ``dtype`` seen as pairs (twice the count for complex)."""
    return math.prod(shape) * (2 if numpy.dtype(dtype).kind == "c" else 1)


def as_pairs(a):
    """``a`` flattened, complex numbers as their ``(re, im)`` pairs (a view where ``a`` is contiguous)."""
    a = numpy.ascontiguousarray(a)
    return (a.view(dtypes.real_of(a.dtype)) if a.dtype.kind == "c" else a).reshape(-1)


def from_pairs(v, shape, dtype):
    """The inverse of :func:`as_pairs`: flat real numbers back into an array of ``shape`` and ``dtype``."""
    dtype = numpy.dtype(dtype)
    if dtype.kind == "c":
        return numpy.ascontiguousarray(v, dtype=dtypes.real_of(dtype)).reshape(-1).view(dtype).reshape(shape)
    return numpy.asarray(v, dtype=dtype).reshape(shape)


def _ranks(layout):
    comm = getattr(layout, "comm", None)
    return None if comm is None else comm.Get_size()


def aslinearoperator(op, lead=(), dtype=None):
    """``op`` as a real ``scipy.sparse.linalg.LinearOperator`` on one rank.

    Parameters
    ----------
    op : LinearOperator
        On a one-rank grid or communicator (``MPI.COMM_SELF``, or a job of
        one rank).
    lead : tuple of int
        Leading (batch) axes of the points: the domain is
        ``op.domain_shape(lead)``.
    dtype : numpy dtype, optional
        Of the domain; by default the dtype the operator takes where it
        fixes one (a transform's real fields, an inverse transform's complex
        coefficients), else float64. The range's follows from one call.

    Returns
    -------
    scipy.sparse.linalg.LinearOperator
        Real, of shape ``(m, n)``: ``n`` the domain's size (twice it for a
        complex domain, as ``(re, im)`` pairs), ``m`` the range's.
        ``matvec(x)`` is ``op.forward`` of ``x`` reshaped, ``rmatvec(y)``
        ``op.adjoint``.

    Raises
    ------
    ValueError
        On every rank, when ``op`` spans more than one rank: SciPy's
        solvers sum over one process only. For many ranks, use a
        distributed solver (the library's ``inner``) instead.
    """
    if not isinstance(op, LinearOperator):
        raise TypeError(f"aslinearoperator: expected a mpisphere LinearOperator, got {type(op).__name__}")
    op._layouts()
    sizes = {n for n in (_ranks(op.domain), _ranks(op.range)) if n is not None}
    if sizes != {1}:
        raise ValueError(f"aslinearoperator: {op.name} spans {max(sizes)} ranks; a SciPy operator runs on one "
                         "rank (build it on ProcessGrid(MPI.COMM_SELF), or solve with the distributed inner product)")
    from scipy.sparse.linalg import LinearOperator as ScipyOperator

    domain_dtype = operator_domain_dtype(op, dtype)
    domain_shape = tuple(op.domain_shape(tuple(lead)))
    probe = op.forward(numpy.zeros(domain_shape, domain_dtype))
    range_shape, range_dtype = tuple(probe.shape), probe.dtype
    real = numpy.float64 if domain_dtype.itemsize >= 8 or range_dtype.itemsize >= 8 else numpy.float32

    def matvec(v):
        return as_pairs(op.forward(from_pairs(v, domain_shape, domain_dtype))).astype(real, copy=False)

    def rmatvec(v):
        return as_pairs(op.adjoint(from_pairs(v, range_shape, range_dtype))).astype(real, copy=False)

    shape = (pairs_size(range_shape, range_dtype), pairs_size(domain_shape, domain_dtype))
    return ScipyOperator(shape, matvec=matvec, rmatvec=rmatvec, dtype=real)

