"""An operator as a pylops-mpi ``MPILinearOperator`` on ``DistributedArray`` objects of this rank's pieces.

pylops-mpi (``pip install '.[pylops]'``, imported when called)
ships distributed solvers (``cg``, ``cgls``, proximal methods) over
``DistributedArray`` objects: each rank holds a local part, dot products sum over
the ranks. :func:`asmpilinearoperator` makes any distributed mpisphere
operator one of its operators: a point's local part is this rank's piece
(tile, block), flattened, complex arrays as their ``(re, im)`` pairs (as in
:mod:`mpisphere.scipy_bridge`: the parts' dot product summed over the ranks
is then mpisphere's inner product, and ``rmatvec`` is the exact adjoint).
No rank ever holds the global vector.

:func:`~mpisphere.pylops_bridge.to_distributed` and
:func:`~mpisphere.pylops_bridge.from_distributed` move a rank's piece into
such a ``DistributedArray`` and back.
"""


import numpy

from . import collectives
from .operators import DISTRIBUTED, LinearOperator
from .operators import domain_dtype as operator_domain_dtype
from .scipy_bridge import as_pairs, from_pairs, pairs_size

__all__ = ["asmpilinearoperator", "to_distributed", "from_distributed"]


def from_distributed(array, shape, dtype):
    """This rank's piece of shape ``shape`` and ``dtype`` from a ``DistributedArray``'s local part."""
    return from_pairs(numpy.asarray(array.local_array), shape, dtype)


def to_distributed(piece, comm):
    """A ``DistributedArray`` over ``comm`` whose local part is ``piece`` flattened (complex as pairs).

    Collective over ``comm`` (the global size is the sum of the parts).
    """
    from pylops_mpi import DistributedArray
    flat = as_pairs(piece)
    sizes = collectives.allgather_object(comm, flat.size)
    array = DistributedArray(global_shape=sum(sizes), base_comm=comm, local_shapes=[(n,) for n in sizes],
                             dtype=flat.dtype)
    array[:] = flat
    return array


def asmpilinearoperator(op, lead=(), dtype=None):
    """``op`` as a real ``pylops_mpi.MPILinearOperator`` over the ranks its inner product sums over.

    Parameters
    ----------
    op : LinearOperator
        With distributed domain and range (each rank its own piece).
    lead : tuple of int
        Leading axes of the points (``op.domain_shape(lead)``).
    dtype : numpy dtype, optional
        Of the domain; by default the dtype the operator takes where it
        fixes one (the transforms), else float64. The range's follows from
        one call.

    Returns
    -------
    pylops_mpi.MPILinearOperator
        Real, of global shape ``(M, N)`` (the sums of the ranks' flattened
        pieces, complex counted twice). ``matvec`` and ``rmatvec`` take and
        return ``DistributedArray`` objects whose local parts are this rank's
        pieces (:func:`~mpisphere.pylops_bridge.to_distributed`, :func:`~mpisphere.pylops_bridge.from_distributed`).

    Notes
    -----
    Collective over the layout's communicator (``op.domain.space``): the
    ranks exchange their pieces' sizes once. Replicated layouts are refused
    (a ``DistributedArray`` would count their copies once per rank).
    """
    if not isinstance(op, LinearOperator):
        raise TypeError(f"asmpilinearoperator: expected a mpisphere LinearOperator, got {type(op).__name__}")
    op._layouts()
    for side in ("domain", "range"):
        if getattr(op, side).kind != DISTRIBUTED:
            raise ValueError(f"asmpilinearoperator: {op.name}'s {side} is replicated; a DistributedArray sums every "
                             "rank's part, so compose the operator with CopyTo/ReduceFrom to make both sides "
                             "distributed")
    from pylops_mpi import DistributedArray, MPILinearOperator

    comm = op.domain.space
    domain_dtype = operator_domain_dtype(op, dtype)
    domain_shape = tuple(op.domain_shape(tuple(lead)))
    probe = op.forward(numpy.zeros(domain_shape, domain_dtype))
    range_shape, range_dtype = tuple(probe.shape), probe.dtype
    sizes = collectives.allgather_object(comm, (pairs_size(domain_shape, domain_dtype),
                                                    pairs_size(range_shape, range_dtype)))
    domain_sizes, range_sizes = [s[0] for s in sizes], [s[1] for s in sizes]
    real = numpy.dtype(numpy.float64 if max(domain_dtype.itemsize, range_dtype.itemsize) >= 8 else numpy.float32)

    def wrap(local, sizes_):
        result = DistributedArray(global_shape=sum(sizes_), base_comm=comm, local_shapes=[(n,) for n in sizes_],
                                  dtype=real)
        result[:] = as_pairs(local).astype(real, copy=False)
        return result

    class _Operator(MPILinearOperator):
        def _matvec(self, x):
            return wrap(op.forward(from_distributed(x, domain_shape, domain_dtype)), range_sizes)

        def _rmatvec(self, y):
            return wrap(op.adjoint(from_distributed(y, range_shape, range_dtype)), domain_sizes)

    return _Operator(shape=(sum(range_sizes), sum(domain_sizes)), dtype=real, base_comm=comm)
