"""The shallow-water model's histories and checkpoints: what a run carries from one call to the next.

A history (``AdamsBashforthHistory`` or ``LeapfrogHistory``, of the
model's scheme) continues the time stepping where a call stopped; a
checkpoint (:mod:`mpisphere.io`) keeps the state, the history and the
model's parameters on disk. Each function takes the
:class:`~mpisphere.examples.ShallowWaterSolver` (``model``) whose methods of
the same names call it; every one is collective over ``model.grid.cart``.
"""

import numpy

from ..agreement import Call
from ..io import checkpoint, open_checkpoint
from . import time_stepping

__all__ = ["history_kind", "check_history", "parameters", "save", "load"]

MODEL = "mpisphere.examples.ShallowWaterSolver"  # the checkpoint's "model" attribute

def history_kind(model):
    """The history class of the model's scheme."""
    return time_stepping.AdamsBashforthHistory if model._implicit is None else time_stepping.LeapfrogHistory


def check_history(model, history, who, uspec=None):
    """Raise on every rank when a rank's ``history`` (None allowed) does not fit this model. Collective.

    A history must be of this scheme's kind and hold what that kind
    holds, arrays of the state's shape and dtype; and every rank's must
    be at the same step with the same steps kept (compared by value): a
    rank two steps ahead would otherwise run the others' steps with its
    own tendencies.
    """
    kind = history_kind(model)
    call = Call(model.grid.cart, who)
    state = None
    with call.local():
        if history is not None:
            state = _describe_history(model, history, kind, uspec)
    call.agree(history=state)


def _describe_history(model, history, kind, uspec):
    """What the ranks compare of ``history``; a TypeError or ValueError for one that does not fit."""
    if not isinstance(history, kind):
        raise TypeError(f"history must be a {kind.__name__} for the {model.scheme} scheme (or None), "
                        f"got {type(history).__name__}")
    shape = tuple(uspec.shape) if uspec is not None else (3,) + tuple(model.sht.block_shape)
    dtype = numpy.dtype(uspec.dtype) if uspec is not None else model.sht.cdtype
    step = history.step
    if isinstance(step, bool) or not isinstance(step, (int, numpy.integer)) or step < 0:
        raise ValueError(f"history.step must be a step number >= 0, got {step!r}")

    def fits(array, what):
        if not isinstance(array, numpy.ndarray) or array.shape != shape or array.dtype != dtype:
            raise ValueError(f"{what} must be this rank's state block {shape} {dtype.name}, got "
                             f"{type(array).__name__} {getattr(array, 'shape', '')} {getattr(array, 'dtype', '')}")
    if kind is time_stepping.LeapfrogHistory:
        if history.previous is not None:
            fits(history.previous, "history.previous")
        elif step > 0:
            raise ValueError(f"history.previous is None after {step} steps (a leapfrog needs the state before)")
        return {"kind": kind.__name__, "step": int(step), "previous": history.previous is not None}
    tendencies = history.tendencies
    if not isinstance(tendencies, dict) or not all(isinstance(n, (int, numpy.integer)) for n in tendencies):
        raise ValueError(f"history.tendencies must map step numbers to tendencies, got {tendencies!r:.80}")
    wanted = set(range(max(step - 2, 0), step))
    if set(tendencies) != wanted:
        raise ValueError(f"history.tendencies must hold steps {sorted(wanted)} at step {step}, got "
                         f"{sorted(tendencies)}")
    for n, tendency in tendencies.items():
        fits(tendency, f"history.tendencies[{n}]")
    return {"kind": kind.__name__, "step": int(step), "tendencies": sorted(int(n) for n in tendencies)}



def parameters(model):
    """What a continuation must share with this model: the grid, truncation, time step and constants (a dict)."""
    return {**model.tiling.parameters(model.sht.quadrature), "lmax": int(model.lmax), "mmax": int(model.mmax),
            "dt": model.dt, "radius": model.radius, "omega": model.omega,
            "gravity": model.gravity, "havg": model.havg, "hamp": model.hamp, "scheme": model.scheme,
            "reference_depth": model.reference_depth, "orography": model._orography_kind,
            # the filter exists in the semi-implicit scheme only (explicit checkpoints stay as they were)
            **({"robert_asselin": model.robert_asselin} if model.scheme == "semi-implicit" else {})}


def save(model, path, uspec, history=None, *, keep=2, allow_nonfinite=False):
    """``ShallowWaterSolver.save``: the checkpoint written, a new version made current once every rank wrote."""
    who = f"ShallowWaterSolver.save({str(path)!r})"
    check_history(model, history, who, uspec)
    # the flag is agreed with the state's check: given on one rank only, every rank names it (it left the
    # ranks in different calls, which they could only call a disagreement)
    arrays = [uspec] + list(getattr(history, "tendencies", {}).values()) + \
        [a for a in [getattr(history, "previous", None)] if a is not None]
    call = Call(model.grid.cart, who)
    if not allow_nonfinite and not all(numpy.isfinite(a).all() for a in arrays):
        call.fail("the state (or its history) is not finite: refused, so that a blown-up run does not "
                  "replace the last good checkpoint (allow_nonfinite=True writes it anyway)",
                  FloatingPointError)
    call.agree(allow_nonfinite=bool(allow_nonfinite))
    history = history_kind(model)() if history is None else history
    steps = sorted(getattr(history, "tendencies", {}), reverse=True)
    previous = getattr(history, "previous", None)
    fields = ["geopotential (m^2/s^2)", "vorticity (1/s)", "divergence (1/s)"]
    with checkpoint(path, model.grid, keep=keep) as store:
        store.write_coefficients("state", uspec, model.sht, dims=("field",), attrs={"fields": fields})
        for i, n in enumerate(steps):
            store.write_coefficients(f"tendency_{i + 1}", history.tendencies[n], model.sht, dims=("field",),
                                     attrs={"step": n, "fields": fields})
        if previous is not None:
            store.write_coefficients("previous", previous, model.sht, dims=("field",),
                                     attrs={"fields": fields, "meaning": "the filtered state one step before"})
        if model._orography_kind == "array":
            store.write_field("orography", model.orography, model.tiling, model.sht.quadrature,
                              attrs={"units": "m"})
        store.set_attrs({"model": MODEL, "parameters": parameters(model),
                         "step": history.step, "time_seconds": history.step * model.dt,
                         "tendency_steps": steps, "has_previous": previous is not None})


def load(model, path):
    """``ShallowWaterSolver.load``: ``(uspec, history)`` of the checkpoint at ``path``, refused if it does not fit."""
    store = open_checkpoint(path, model.grid)
    attrs = store.attrs()
    saved = attrs.get("parameters", {})
    if attrs.get("model") != MODEL or saved != parameters(model):
        differ = ", ".join(f"{k} {saved.get(k)!r} in the checkpoint, {v!r} here"
                           for k, v in parameters(model).items() if saved.get(k) != v)
        raise ValueError(f"ShallowWaterSolver.load({path!r}): the checkpoint does not fit this model (ranks "
                         f"0-{model.grid.size - 1} of {model.grid.size}): "
                         f"{differ or 'it was not written by ShallowWaterSolver.save'}")
    if model._orography_kind == "array":
        saved_orography = store.read_field("orography", model.tiling, model.sht.quadrature)
        call = Call(model.grid.cart, f"ShallowWaterSolver.load({path!r})")
        if not numpy.array_equal(saved_orography, model.orography):
            call.fail("the checkpoint's orography differs from this model's on this rank's tile")
        call.agree()
    uspec = store.read_coefficients("state", model.sht)
    if model._implicit is not None:
        previous = store.read_coefficients("previous", model.sht) if attrs.get("has_previous", False) else None
        return uspec, time_stepping.LeapfrogHistory(attrs["step"], previous)
    tendencies = {int(n): store.read_coefficients(f"tendency_{i + 1}", model.sht)
                  for i, n in enumerate(attrs["tendency_steps"])}
    return uspec, time_stepping.AdamsBashforthHistory(attrs["step"], tendencies)
