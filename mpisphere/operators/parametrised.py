"""The base of the operators with parameters: named parameters the ranks compare, and their gradients in one sum.

A parametrised operator (DISCO convolution, spectral convolution,
resampling, quadrature, attention) maps this rank's tile of a field to this
rank's tile of another with parameters that are the same on every rank
(weights, a bias; none for resampling and quadrature). What this base owns,
so that no operator writes it again:

* the parameters, by name (``parameter_names``), set together by
  ``ParametrisedOperator.set_parameters`` (the subclass checks them
  in ``_prepare_parameters`` and derives its tables from them), each
  described once (a digest) for every call's agreement: a parameter that
  differs on one rank raises on every rank, naming the operator, the call
  and the rank;
* ``ParametrisedOperator.gradients``: the local checks, one agreement,
  the subclass's pass (``_gradient_parts``: the input's gradient and this
  rank's part of each parameter's), then one ``Allreduce`` over the grid of
  every parameter's part at once: whole-sphere gradients, the same on every
  rank;
* the input's and output's tiles: the subclass names its tilings
  (``tiling_in``, ``tiling_out``: which points of each whole field this
  rank holds; None for a replicated output) and the channels of each side,
  and the base checks a call's arrays against them (``_check_side``).
"""

import numpy

from .. import backend, collectives
from ..agreement import Call, Context, InputError, Spec, collective
from ..agreement.description import describe_parameter
from ..grid import check_tile
from .base import LinearOperator
from .calling import allocate as _allocate
from .layout import ADJOINT

__all__ = ["ParametrisedOperator", "parameter", "sum_parts"]


def parameter(name, doc):
    """A settable attribute for parameter ``name``: reads its value, ``op.name = value`` sets it alone."""
    def read(self):
        return self._parameter_values[name]

    def write(self, value):
        self.set_parameters(**{name: value})
    return property(read, write, doc=doc)


class ParametrisedOperator(LinearOperator):
    """An operator with named parameters, the same on every rank, and their whole-sphere gradients.

    A subclass lists its parameters in ``parameter_names`` and implements

    * ``_prepare_parameters(values)``: ``values`` maps every name to a host
      array or None; returns the arrays to keep (converted, checked: raise
      ``ValueError`` naming the expected shape) and derives what the calls
      use from them;
    * ``_call_output(direction, spec)``: the result's ``Spec`` and the
      input's description (what ``_output`` is for other operators; the
      parameters' description is added here);
    * ``tiling_in``, ``tiling_out`` (attributes) and ``_side_channels(side)``:
      the tilings of the input and the output (None: the output is
      replicated) and the channels axis before a tile's axes (None: none);
    * ``_gradient_parts(x, y_bar, input_gradient, context)``: the input's
      gradient (or None) and a dict of this rank's part of each set
      parameter's gradient (host arrays, the parameter's shape). The default
      serves operators without parameters: the adjoint.

    Attributes
    ----------
    parameter_names : tuple of str
        The parameters, in the order :meth:`gradients` returns theirs.
    linear : bool
        False when the operator is not linear in its input (an additive
        bias, angles): it then has no adjoint, and :meth:`gradients` gives
        what a backward pass needs.
    """

    parameter_names = ()

    def _init_parameters(self, **values):
        self._parameter_values = dict.fromkeys(self.parameter_names)
        self._parameter_texts = dict.fromkeys(self.parameter_names, "None")
        self.set_parameters(**values)

    # --- parameters ------------------------------------------------------------------------------

    def set_parameters(self, **values):
        """Set parameters by name (the others keep their values); every one is checked before any is set.

        Parameters
        ----------
        **values : array or None
            Host or device arrays of the documented shapes (copied in the
            operator's precision), or None for an optional parameter.

        Raises
        ------
        ValueError
            An unknown name or a wrong shape, on this rank only (setting
            never communicates; a value that differs between ranks raises on
            every rank at the next call, which compares them).
        """
        unknown = sorted(set(values) - set(self.parameter_names))
        if unknown:
            raise ValueError(f"{self.name}: no parameter named {', '.join(unknown)}; its parameters are "
                             f"{', '.join(self.parameter_names) or 'none'}")
        merged = dict(self._parameter_values)
        merged.update({name: None if v is None else backend.to_host(v) for name, v in values.items()})
        kept = self._prepare_parameters(merged)
        self._parameter_values = {name: kept.get(name) for name in self.parameter_names}
        self._parameter_texts = {name: "None" if value is None else describe_parameter(value)
                                 for name, value in self._parameter_values.items()}

    def _prepare_parameters(self, values):
        return values

    @property
    def parameters(self):
        """``{name: host array or None}``: the parameters, in ``parameter_names``' order (do not write into them)."""
        return dict(self._parameter_values)

    def describe_parameters(self):
        """What the ranks compare about the parameters: ``"weight=<digest>, bias=None"`` ("" without any)."""
        return ", ".join(f"{name}={text}" for name, text in self._parameter_texts.items())

    @property
    def linear(self):
        return True

    # --- calls -----------------------------------------------------------------------------------

    def _output(self, direction, spec):
        if direction == ADJOINT and not self.linear:
            raise InputError(self._not_linear(), TypeError)
        result, text = self._call_output(direction, spec)
        described = self.describe_parameters()
        return result, f"{text}, {described}" if described else text

    def _not_linear(self):
        return (f"{self.name} is not linear in its input here and has no adjoint\n  fix: gradients(x, y_bar) gives "
                "the input's gradient (the adjoint of its derivative at x)")

    def _call_output(self, direction, spec):
        raise NotImplementedError

    tiling_in = None
    tiling_out = None

    def _side_channels(self, side):
        return None

    def _check_side(self, spec, side, what):
        """This rank's finding when ``spec`` is not its tile of ``side`` (``"in"`` or ``"out"``)."""
        tiling = self.tiling_in if side == "in" else self.tiling_out
        if tiling is None:
            if spec.dtype != self.dtype:
                raise InputError(f"{what}: expected {self.dtype.name}, got {spec.dtype.name}", TypeError)
            return
        check_tile(tiling.grid, spec, tiling.whole, self.dtype, self._side_channels(side), what)

    @collective
    def gradients(self, x, y_bar, input_gradient=True):
        """The gradients of ``<y_bar, forward(x)>`` with respect to ``x`` and to every parameter.

        Parameters
        ----------
        x : array
            This rank's input tile (what ``forward`` took).
        y_bar : array
            The output's cotangent: this rank's output tile (or the
            replicated output), with ``x``'s leading axes.
        input_gradient : bool
            Also compute the input's gradient.

        Returns
        -------
        tuple
            ``(x_bar, *gradients)``: ``x_bar`` this rank's tile of the
            input's gradient (None without ``input_gradient``), then one
            gradient per name of ``parameter_names``, each the whole-sphere
            gradient, the same on every rank (None for a parameter not
            set). A complex parameter's is ``dL/dRe + i dL/dIm`` (PyTorch's
            convention).

        Notes
        -----
        Collective over the grid: one agreement, the operator's own
        communication, one ``Allreduce`` of all parameters' parts.
        """
        who = f"{self.name}.gradients"
        call = Call(self.grid.cart, who)
        spec_x = None
        with call.local():
            spec_x, spec_y = Spec.of(x), Spec.of(y_bar)
            self._check_side(spec_x, "in", "x")
            self._check_side(spec_y, "out", "y_bar")
            lead_x, lead_y = self._lead(spec_x, "in"), self._lead(spec_y, "out")
            if lead_x != lead_y:
                raise InputError(f"x and y_bar have different leading axes: {lead_x} and {lead_y}")
            self._check_gradient_values(x, y_bar)
        described = self.describe_parameters()
        call.agree(f"{self._describe()} gradients: input_gradient={bool(input_gradient)}, "
                   f"x={spec_x.describe((-2, -1)) if spec_x is not None else None}"
                   + (f", {described}" if described else ""))
        x_bar, parts = self._gradient_parts(x, y_bar, bool(input_gradient), Context.local(spec_x))
        return (x_bar,) + self._sum_over_grid(parts)

    def _lead(self, spec, side):
        """The leading (batch) axes of a tile of ``side``: all but the core of ``_core_ndim(side)`` axes."""
        return tuple(spec.shape[:len(spec.shape) - self._core_ndim(side)])

    def _core_ndim(self, side):
        tiling = self.tiling_in if side == "in" else self.tiling_out
        if tiling is None:
            return 0
        return len(tiling.whole) + (self._side_channels(side) is not None)

    def _check_gradient_values(self, x, y_bar):
        """A finding for values the gradients refuse (a non-finite point); none by default."""

    def _gradient_parts(self, x, y_bar, input_gradient, context):
        if not input_gradient:
            return None, {}
        spec, _ = self._call_output(ADJOINT, Spec.of(y_bar))
        x_bar = _allocate(spec, y_bar)
        self._run(ADJOINT, y_bar, x_bar, context)
        return x_bar, {}

    def _sum_over_grid(self, parts):
        """Every parameter's part summed over the grid in one ``Allreduce``, in the parameters' dtypes."""
        names = [name for name in self.parameter_names if parts.get(name) is not None]
        summed = dict(zip(names, sum_parts(self.grid.cart, [parts[name] for name in names])))
        return tuple(None if name not in summed else
                     summed[name].reshape(self._parameter_values[name].shape).astype(self._parameter_values[name].dtype)
                     for name in self.parameter_names)


def sum_parts(comm, parts):
    """Host arrays ``parts`` summed over ``comm`` in one ``Allreduce`` (float64; complex ones as complex128 pairs).

    The one sum of the parametrised operators' gradients and of the torch layers' statistics; returns
    the sums in ``parts``' order and shapes. Collective over ``comm`` (the caller has agreed).
    """
    if not parts:
        return []
    wide = [numpy.asarray(p).astype(numpy.complex128 if numpy.iscomplexobj(p) else numpy.float64) for p in parts]
    flat = numpy.concatenate([w.reshape(-1).view(numpy.float64) for w in wide])
    total = numpy.empty_like(flat)
    collectives.allreduce(comm, flat, total)
    found, start = [], 0
    for w in wide:
        size = w.size * (2 if numpy.iscomplexobj(w) else 1)
        piece = total[start:start + size]
        start += size
        found.append((piece.view(numpy.complex128) if numpy.iscomplexobj(w) else piece).reshape(w.shape))
    return found
