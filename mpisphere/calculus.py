"""``mpisphere.calculus``: the spectral operators, importable by their short path.

``from mpisphere.calculus import laplacian`` works as ``mpisphere.calculus.laplacian``
always did; the operators live in :mod:`mpisphere.sht.calculus`.
"""

from .sht.calculus import *  # noqa: F401,F403  (the public names, listed in __all__)
from .sht.calculus import __all__  # noqa: F401
