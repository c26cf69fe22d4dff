"""Process-wide switches: the one settings object of mpisphere.

``mpisphere.config`` is the only mutable object the package keeps at module
level, and it holds switches only (no communicators, no buffers, no
caches). Every operator reads it when it runs, so a switch set in code takes
effect on the next call. Set a switch the same way on every rank: a switch
that differs between ranks is reported as a disagreement (``debug``,
``force_staging``) or, for ``agreement``, can leave ranks waiting.

Environment variables are read once, when mpisphere is imported:

``MPISPHERE_DEBUG=1``
    deeper checks: the ranks always compare their full call descriptions,
    not only a digest of them.
``MPISPHERE_AGREEMENT=0``
    skip the agreement step that operators run before they communicate (see
    :mod:`mpisphere.operators`). Only for code whose every call is proven to
    match across ranks: a mistake then hangs or returns wrong data.
``MPISPHERE_CUDA_AWARE=0|1``
    override the detection of a CUDA-aware MPI library (see
    :mod:`mpisphere.cuda_aware`). Unset means detect.
``MPISPHERE_STALL_REPORT=SECONDS``
    after this long waiting in an agreement (a rank never arrives), print
    who waits where and who is missing, once, to stderr (default 60; 0
    turns it off).
``MPISPHERE_STALL_DEADLINE=SECONDS``
    after this long, print the report and abort the job (default: never;
    the test plugin sets it for the ranks it launches).
``MPISPHERE_SHARED_MEMORY=0``
    halo exchanges send every block as a message, even from arrays in
    memory shared on the node (as between nodes).
"""

import os

__all__ = ["Config", "config"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_SWITCHES = ("debug", "agreement", "cuda_aware", "force_staging", "device_kernels", "stall_report", "stall_deadline",
             "shared_memory")
_DESCRIBED = ("debug", "force_staging")  # the switches every call's description names (config.generation)


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


def _parse_seconds(name, value, default):
    text = value.strip().lower()
    if text in ("", "auto"):
        return default
    if text in ("never", "off", "none"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"environment variable {name}={value!r}: expected seconds (a number >= 0) or 'never'")
    return None if seconds == 0 else seconds


def _check_seconds(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise TypeError(f"mpisphere.config.{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


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
        Compare the full call descriptions across ranks on every call, not
        only their digest (``MPISPHERE_DEBUG``).
    agreement : bool
        Run the agreement step before communicating (default True,
        ``MPISPHERE_AGREEMENT``). Must be the same on every rank.
    cuda_aware : bool or None
        ``True``: hand device buffers to MPI directly. ``False``: stage them
        through pinned host buffers. ``None`` (default): detect, and agree
        across ranks (``MPISPHERE_CUDA_AWARE`` sets it at import).
    force_staging : bool
        Testing aid: run the host-staging code path for NumPy buffers too, so
        that the staging logic is exercised on machines without a GPU. Results
        are identical, only slower.
    device_kernels : bool
        Testing aid: NumPy arrays take the algorithms written for CuPy arrays
        (batched products, one copy per layout change, no host loops), so that
        a machine without a GPU can check their results and count the
        operations a call issues (``tests/test_launch_counts.py``). Results
        agree to rounding; the host is slower this way.
    stall_report : float or None
        Seconds a rank waits in an agreement before it prints, once, where it
        waits, which ranks of the call have arrived and which have not, and
        the likely causes (``MPISPHERE_STALL_REPORT``, default 60; None: no
        report). Set it the same way on every rank.
    stall_deadline : float or None
        Seconds after which a rank still waiting prints the report and
        aborts the job (``MPI_Abort``: a rank that never arrives cannot be
        recovered from; ``MPISPHERE_STALL_DEADLINE``, default None: never).
        Off by default so that a long production run is never killed; the
        test plugin sets it for the ranks it launches.
    shared_memory : bool
        A halo exchange leaves the blocks of an array from
        ``HaloExchange.zeros`` in shared memory for the neighbours of the same
        node to read (default True, ``MPISPHERE_SHARED_MEMORY``). False sends
        them as messages, as between nodes. It may differ between ranks: each
        rank decides for the blocks it sends, and the receivers read either.
    generation : int
        Counts the settings of the switches that enter the description of
        every call (``debug``, ``force_staging``; read only): a halo call
        planned under some switches is replayed only while it has not moved.
    """

    __slots__ = _SWITCHES + ("generation",)

    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        put = object.__setattr__  # the environment is checked by its own parsers
        put(self, "generation", 0)
        put(self, "debug", _parse_flag("MPISPHERE_DEBUG", environ.get("MPISPHERE_DEBUG", "0"), False))
        put(self, "agreement", _parse_flag("MPISPHERE_AGREEMENT", environ.get("MPISPHERE_AGREEMENT", "1"), False))
        put(self, "cuda_aware", _parse_flag("MPISPHERE_CUDA_AWARE", environ.get("MPISPHERE_CUDA_AWARE", ""), True))
        put(self, "force_staging", False)
        put(self, "device_kernels", False)
        put(self, "stall_report", _parse_seconds("MPISPHERE_STALL_REPORT", environ.get("MPISPHERE_STALL_REPORT", ""),
                                                 60.0))
        put(self, "stall_deadline", _parse_seconds("MPISPHERE_STALL_DEADLINE",
                                                   environ.get("MPISPHERE_STALL_DEADLINE", ""), None))
        put(self, "shared_memory", _parse_flag("MPISPHERE_SHARED_MEMORY", environ.get("MPISPHERE_SHARED_MEMORY", "1"),
                                               False))

    def __setattr__(self, name, value):
        # checked here, read as plain attributes: a switch read on every call of a halo costs no Python call
        if name not in _SWITCHES:
            raise AttributeError(f"mpisphere.config.{name} is read only" if name == "generation" else
                                 f"mpisphere.config has no switch {name!r}; it has {', '.join(_SWITCHES)}")
        if name in ("stall_report", "stall_deadline"):
            value = _check_seconds(name, value)
        else:
            value = _check_flag(name, value, name == "cuda_aware")
        object.__setattr__(self, name, value)
        if name in _DESCRIBED:
            object.__setattr__(self, "generation", self.generation + 1)

    def override(self, **switches):
        """Context manager that sets switches and restores them on exit.

        >>> with mpisphere.config.override(debug=True):
        ...     y = op.forward(x)
        """
        return _Override(self, switches)

    def __repr__(self):
        return "Config(" + ", ".join(f"{name}={getattr(self, name)}" for name in _SWITCHES) + ")"


class _Override:
    def __init__(self, cfg, switches):
        for name in switches:
            if name not in _SWITCHES:
                raise AttributeError(f"mpisphere.config has no switch {name!r}; it has {', '.join(_SWITCHES)}")
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
