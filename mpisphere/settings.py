"""Process-wide switches: the one settings object of mpisphere.

``mpisphere.config`` is the only mutable object the package keeps at module
level, and it holds switches only (no communicators, no buffers, no caches
that grow). Every operator reads it when it runs, so a switch set in code
takes effect on the next call.

Environment variables are read once, when mpisphere is imported:

``MPISPHERE_DEBUG=1``
    compare shapes and dtypes across ranks before every collective, so that a
    mismatch that only shows across ranks is an error on every rank instead of
    a hang or corrupted data. Costs one small ``allgather`` per call.
``MPISPHERE_CUDA_AWARE=0|1``
    override the detection of a CUDA-aware MPI library (see
    :mod:`mpisphere.cuda_aware`). Unset means detect.
"""

import os

__all__ = ["Config", "config"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse_flag(name, value, allow_none):
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    if allow_none and text in ("", "auto"):
        return None
    choices = "0 or 1" + (" (or unset/auto)" if allow_none else "")
    raise ValueError(f"environment variable {name}={value!r}: expected {choices}")


def _check_flag(name, value, allow_none):
    if value is None and allow_none:
        return None
    if isinstance(value, bool):
        return value
    allowed = "True, False or None" if allow_none else "True or False"
    raise TypeError(f"mpisphere.config.{name} must be {allowed}, got {value!r}")


class Config:
    """Switches that change how operators run, not what they compute.

    Attributes
    ----------
    debug : bool
        Cross-rank metadata checks before every collective (``MPISPHERE_DEBUG``).
    cuda_aware : bool or None
        ``True``: hand device buffers to MPI directly. ``False``: stage them
        through pinned host buffers. ``None`` (default): detect once, the same
        answer on every rank (``MPISPHERE_CUDA_AWARE`` sets it at import).
    force_staging : bool
        Testing aid: run the host-staging code path for NumPy buffers too, so
        that the staging logic is exercised on machines without a GPU. Results
        are identical, only slower.
    """

    __slots__ = ("_debug", "_cuda_aware", "_force_staging", "_cuda_aware_decision")

    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        self._debug = _parse_flag("MPISPHERE_DEBUG", environ.get("MPISPHERE_DEBUG", "0"), False)
        self._cuda_aware = _parse_flag("MPISPHERE_CUDA_AWARE", environ.get("MPISPHERE_CUDA_AWARE", ""), True)
        self._force_staging = False
        # (bool, source) once decided; reset whenever cuda_aware is set
        self._cuda_aware_decision = None

    @property
    def debug(self):
        return self._debug

    @debug.setter
    def debug(self, value):
        self._debug = _check_flag("debug", value, False)

    @property
    def cuda_aware(self):
        return self._cuda_aware

    @cuda_aware.setter
    def cuda_aware(self, value):
        self._cuda_aware = _check_flag("cuda_aware", value, True)
        self._cuda_aware_decision = None

    @property
    def force_staging(self):
        return self._force_staging

    @force_staging.setter
    def force_staging(self, value):
        self._force_staging = _check_flag("force_staging", value, False)

    @property
    def device_buffer_path(self):
        """One line: how device buffers reach MPI now (CUDA-aware or staged), and why.

        Never communicates (see :func:`mpisphere.collectives.describe_path`).
        """
        from .collectives import describe_path  # settings sits below collectives
        return describe_path()

    def override(self, **switches):
        """Context manager that sets switches and restores them on exit.

        >>> with mpisphere.config.override(debug=True):
        ...     y = op.forward(x)
        """
        return _Override(self, switches)

    def __repr__(self):
        return (f"Config(debug={self._debug}, cuda_aware={self._cuda_aware}, "
                f"force_staging={self._force_staging})")


class _Override:
    def __init__(self, cfg, switches):
        for name in switches:
            if name not in ("debug", "cuda_aware", "force_staging"):
                raise AttributeError(f"mpisphere.config has no switch {name!r}")
        self._cfg = cfg
        self._switches = switches
        self._saved = None

    def __enter__(self):
        self._saved = {name: getattr(self._cfg, name) for name in self._switches}
        for name, value in self._switches.items():
            setattr(self._cfg, name, value)
        return self._cfg

    def __exit__(self, *exc):
        for name, value in self._saved.items():
            setattr(self._cfg, name, value)
        return False


config = Config()
