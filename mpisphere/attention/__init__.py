"""Attention on the sphere over distributed tiles: neighbourhood and global (torch-harmonics' semantics).

======================  =========================================================
module                  owns
======================  =========================================================
``arcs``                the neighbourhoods as arcs of input rings (no MPI)
``gather``              the points a rank's neighbourhoods reach: one ``Alltoallv`` and its adjoint
``kernels``             projections, q/k normalisation, the online quadrature-weighted softmax (no MPI)
``base``                what both share: arguments, parameters, checks, projections, the backward's chain
``neighbourhood``       ``NeighborhoodAttentionS2``: the arcs read as strided views, ring by ring
``whole_sphere``        ``AttentionS2``: the keys and values passed round a ring of the ranks
======================  =========================================================
"""

from .arcs import default_attention_cutoff, neighbourhood_arcs
from .neighbourhood import NeighborhoodAttentionS2
from .whole_sphere import AttentionS2

__all__ = ["NeighborhoodAttentionS2", "AttentionS2", "neighbourhood_arcs", "default_attention_cutoff"]
