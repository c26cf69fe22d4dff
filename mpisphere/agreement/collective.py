"""The agreement over a communicator: per call (``agree``) or once at construction, and its errors."""


import numpy
from mpi4py import MPI

from .. import collectives, cuda_aware
from ..settings import config
from .description import call_description, description_of, digest
from .differing import ARGUMENT, CALL, INPUT, SWITCHES, VALUE, grouped, ranks_text, shown, what_differs
from .spec import Context
from .stall import wait


def cause_first(text, after):
    """A finding's cause (its first line); its other lines (what to do, details) go onto ``after``, each once."""
    cause, *rest = text.split("\n")
    after.extend(line for line in rest if line not in after)
    return cause


# the exception classes a finding keeps across ranks, by name (anything else arrives as a ValueError)
KINDS = {"TypeError": TypeError, "RuntimeError": RuntimeError, "MemoryError": MemoryError, "OSError": OSError,
          "FileNotFoundError": FileNotFoundError, "FileExistsError": FileExistsError,
          "PermissionError": PermissionError, "ImportError": ImportError, "FloatingPointError": FloatingPointError}


def as_exception(who, errors, rank=None):
    """One exception from ``(rank, size, kind name, text)`` findings (the same on every rank).

    Ranks with the same finding are named together (``ranks 0-5 of 6: ...``);
    the first four different findings are quoted. The class is the findings'
    own when they share one (TypeError, RuntimeError, MemoryError, OSError
    and its file errors, ImportError), else ValueError. A finding's text is
    its cause on the first line (ranks are grouped by it), then lines that
    say what to do and the details (each different line shown once). Given
    this process's ``rank``, the message is printed once: in full by the
    first rank with a finding, in one line naming it by the others (see
    :func:`printed_once`).
    """
    kinds = {kind for _, _, kind, _ in errors}
    cls = KINDS.get(next(iter(kinds)), ValueError) if len(kinds) == 1 else ValueError
    size = errors[0][1]
    groups = {}
    after = []  # the lines after the causes (what to do, then each rank's details), each different line once
    for r, _, _, text in errors:
        groups.setdefault(cause_first(text, after), []).append(r)
    items = list(groups.items())
    shown = " | ".join(f"{ranks_text(ranks)} of {size}: {cause}" for cause, ranks in items[:4])
    rest = sum(len(ranks) for _, ranks in items[4:])
    more = f" | and {rest} more rank{'s' if rest > 1 else ''}" if rest else ""
    if len(after) > 12:
        after = after[:11] + [f"  ... and {len(after) - 11} more lines"]
    message = f"{who}: {shown}{more}" + "".join(f"\n{line}" for line in after)
    reporter = min(r for r, _, _, _ in errors)
    return printed_once(cls(message), who, rank, reporter, f"{ranks_text(items[0][1])} of {size}: {items[0][0]}")


def printed_once(exc, who, rank, reporter, cause, everywhere=True):
    """``exc`` as raised on ``rank``: its whole message on ``reporter``, one line naming ``reporter`` elsewhere.

    Under ``mpiexec`` every rank's traceback reaches the terminal; the whole
    message (often several hundred characters, the same on every rank) is
    printed once. Every rank keeps it as ``exc.mpisphere_message``, and
    ``exc.mpisphere_reporter`` names the rank that prints it. ``rank=None``
    (one process, or a caller that prints nothing) keeps the whole message.
    ``everywhere=False``: some ranks of the call return normally (a halo's
    neighbourhood), so the exception is not marked :func:`agreed`.
    """
    exc.mpisphere_message = str(exc)
    exc.mpisphere_reporter = reporter
    if rank is not None and rank != reporter:
        line = " ".join(cause.split())
        line = line if len(line) <= 160 else line[:157] + "..."
        exc.args = (f"{who}: {line} [the whole message: rank {reporter}'s error]",)
    return agreed(exc) if everywhere else exc


def agreed(exc):
    """``exc`` marked as raised by every rank of one agreement (``exc.mpisphere_agreed``).

    A caller cleaning up after it (a checkpoint's ``__exit__``) knows that
    every rank left at the same step and needs no further step of its own.
    """
    exc.mpisphere_agreed = True
    return exc


DIFFERENT_CALLS_FIX = (
    "  fix: make the same mpisphere calls in the same order on every rank: a call made inside 'if rank == ...' "
    "(or skipped on some ranks, by a branch or an exception caught there) leaves those ranks a call ahead or behind")


def _fix(who, found, summary=""):
    """The ``fix:`` line of a disagreement whose fields ``found`` (``(key, kind)``, see :mod:`.differing`) differ."""
    name = who.split("(")[0]
    name = name.rsplit(".", 1)[0] if "." in name else name
    def listed(kind):
        keys = [k.split(": ")[-1] for k, c in found if c == kind]
        return ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
    kinds = {kind for _, kind in found}
    lines = []
    if SWITCHES in kinds:
        lines.append("set MPISPHERE_DEBUG and MPISPHERE_FORCE_STAGING (mpisphere.config.debug and "
                     ".force_staging) alike on every rank")
    if ARGUMENT in kinds:
        lines.append(f"build {name} with the same {listed(ARGUMENT)} on every rank (a value computed from the rank, "
                     "read from a file or a clock?)")
    if VALUE in kinds:
        lines.append(f"pass the same {listed(VALUE)} on every rank")
    if CALL in kinds and "recorded by autograd" in summary:
        lines.append("make requires_grad (and torch.no_grad) the same on every rank: the backward of an operator "
                     "communicates too, and must run on every rank or on none")
    elif CALL in kinds:
        lines.append(f"make the same call of {name} on every rank")
    if INPUT in kinds:
        lines.append("give every rank an input of the same kind: the same leading (batch) shape, dtype and device "
                     "(only the axes split over the ranks may differ)")
    if not lines:
        lines.append("make every rank do the same thing here (below: what each rank has)")
    return "  fix: " + "; ".join(lines)


def disagreement(who, size, mismatch, texts, rank, ranks=None, whos=None, where=""):
    """The ValueError of ranks whose descriptions ``texts`` differ, printed in full by rank 0 (:func:`printed_once`).

    The first line names what differs: the calls each rank is in, when
    ``whos`` (each rank's call) differ, else the fields that differ
    (``nlat: ranks 0-2 64, rank 3 65``); a ``fix:`` line follows, then each
    group's whole description (a transform's measured machine profile only
    where it differs). ``where`` names a sub-communicator the difference is
    within.
    """
    ranks = list(range(len(texts))) if ranks is None else list(ranks)
    groups = grouped(texts, ranks)
    calls = grouped(whos, range(len(whos))) if whos is not None else []
    summary, found = what_differs(texts, ranks)
    if len(calls) > 1:
        cause = f"the {size} ranks are in different calls: " + ", ".join(
            f"{ranks_text(rs)} in {w}" for w, rs in calls[:4]) + (", ..." if len(calls) > 4 else "")
        fix = DIFFERENT_CALLS_FIX
    elif summary:
        cause = f"the {size} ranks {mismatch}{where}: {summary}"
        fix = _fix(who, found, summary)
    else:
        odd = sorted(r for _, rs in groups[1:] for r in rs)
        cause = f"the {size} ranks {mismatch}{where} ({ranks_text(odd)} differ{'s' if len(odd) == 1 else ''})"
        fix = _fix(who, [])
    machine = any(k.endswith("machine") for k, _ in found)
    details = [f"  {ranks_text(rs)} {'has' if len(rs) == 1 else 'have'}: {shown(text, machine)}"
               for text, rs in groups[:4]]
    if len(groups) > 4:
        details.append(f"  and {len(groups) - 4} more variants")
    exc = ValueError("\n".join([f"{who}: {cause}", fix, *details]))
    return printed_once(exc, who, rank, 0, cause)


# --- over a communicator -------------------------------------------------------------------------------

def _group_id(comm, space):
    """The space rank of ``comm``'s rank 0: the same on every member of ``comm``, different between groups."""
    if comm is space:
        return 0
    return int(MPI.Group.Translate_ranks(comm.Get_group(), [0], space.Get_group())[0])


def _reduce(comm, flags, who):
    """The agreement's one reduction (elementwise maximum, in place), watched for a rank that never arrives.

    Its last word carries the halo failures of a grid's whole communicator (``Failures.token``, 0 elsewhere):
    after it, every rank knows the last halo call that raised anywhere (``Failures.learn``).
    """
    failures = getattr(comm, "failures", None)
    flags[-1] = 0 if failures is None else failures.token()
    wait(collectives.iallreduce_max_ints(comm, flags), comm, who)
    if failures is not None:
        failures.learn(flags[-1])


def _raising(comm):
    """The agreement is about to raise on every rank: the halo failures it told of are raised with it."""
    failures = getattr(comm, "failures", None)
    if failures is not None:
        failures.raising()


def agree(comm, who, error, description, spec=None, signature=""):
    """The agreement step over ``comm``: collective; raises the same error on every rank, or returns.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The ranks about to communicate.
    who : str
        ``"Operator.direction"``, the start of every message.
    error : InputError or None
        This rank's local finding (bad input, a failed allocation, a refused
        call).
    description : str or list of (comm or None, str)
        What this rank is about to do, in words that are the same on every
        rank that does the same thing (no rank numbers, split axes masked).
        A composition gives one part per operator with the communicator the
        part must agree over: a part on ``comm`` itself must match on every
        rank, a part on a sub-communicator (``grid.polar`` inside a grid)
        only within its row or column, a part on ``None`` nowhere.
    spec : Spec, optional
        The input's spec: when it lives on a device, the ranks also agree
        on whether MPI is CUDA-aware.
    signature : str
        The operator and call (``"Transpose(...) forward"``), which must
        match on every rank.

    Returns
    -------
    Context
        The agreed context (staging decision).

    Raises
    ------
    The findings' own class (TypeError, ValueError, RuntimeError, MemoryError)
        On every rank, when any rank had a finding or the descriptions differ.
    """
    size = comm.Get_size()
    parts = [(comm, description)] if isinstance(description, str) else list(description)
    on_comm = " | ".join(text for c, text in parts if c is comm)
    kind = "" if spec is None else f" [{spec.dtype.name} on {'device' if spec.device else 'host'}]"
    here = call_description(f"{signature}: {on_comm}" if on_comm else f"{signature}{kind}")
    device = spec is not None and spec.device
    if size == 1 or not config.agreement:
        if error is not None:
            raise as_exception(who, [(comm.Get_rank(), size, error.kind.__name__, error.text)], comm.Get_rank())
        return Context.local(spec)
    everything = digest(" | ".join(text for _, text in parts))
    code = digest(here)
    not_aware = 1 if device and not config.force_staging and not cuda_aware.verdict()[0] else 0
    flags = numpy.array([0 if error is None else 1, code, -code, everything, -everything, not_aware, 0],
                        dtype=numpy.int64)
    _reduce(comm, flags, who)
    context = Context(config.force_staging or (device and flags[5] > 0))
    if flags[0] == 0 and flags[1] == -flags[2] and not config.debug:
        if flags[3] == -flags[4]:
            return context
        # the parts on sub-communicators differ somewhere: they need only agree within their groups
        if not _groups_disagree(comm, parts):
            return context
    everyone = collectives.allgather_object(
        comm, (None if error is None else (error.kind.__name__, error.text), here,
               [(None if c is None else (c.Get_name() or "a sub-communicator", _group_id(c, comm)), text)
                for c, text in parts if c is not comm], who))
    errors = [(r, size, e[0], e[1]) for r, (e, _, _, _) in enumerate(everyone) if e is not None]
    if errors:
        _raising(comm)
        raise as_exception(who, errors, comm.Get_rank())
    texts, whos = [d for _, d, _, _ in everyone], [w for _, _, _, w in everyone]
    mismatch = "disagree on what they are about to do"
    if len(set(texts)) > 1:
        _raising(comm)
        raise disagreement(who, size, mismatch, texts, comm.Get_rank(), whos=whos)
    # the ranks agree here: find the groups of a sub-communicator that do not
    for index in range(min(len(parts_of) for _, _, parts_of, _ in everyone)):
        group_of = {}
        for r, (_, _, subparts, _) in enumerate(everyone):
            where, text = subparts[index]
            if where is not None:
                group_of.setdefault(where, {})[r] = text
        for (name, _), members in group_of.items():
            if len(set(members.values())) > 1:
                _raising(comm)
                raise disagreement(who, size, mismatch, [members[r] for r in sorted(members)], comm.Get_rank(),
                                   ranks=sorted(members), where=f" within {name}")
    return context  # debug mode compared everything and found it equal


def _groups_disagree(comm, parts):
    """Check each sub-communicator part within its groups; the same answer on every rank of ``comm``."""
    bad = 0
    for c, text in parts:
        if c is None or c is comm:
            continue
        code = digest(text)
        pair = numpy.array([code, -code], dtype=numpy.int64)
        collectives.allreduce_max_ints(c, pair)
        bad |= int(pair[0] != -pair[1])
    flag = numpy.array([bad], dtype=numpy.int64)
    collectives.allreduce_max_ints(comm, flag)
    return bool(flag[0])


def settle(comm, who, error, description="", mismatch="disagree on what they are about to do"):
    """Collective over ``comm``: raise every rank's finding on every rank, or return when there is none.

    The agreement of a step that must hold whatever
    ``mpisphere.config.agreement`` says (a file written or read, a store
    checked): one ``Allreduce`` of an error flag and a digest of
    ``description``; the findings and descriptions are exchanged only when
    some rank has a finding or the descriptions differ.

    Parameters
    ----------
    error : InputError or None
        This rank's finding.
    description : str
        What this rank is about to do, the same text on every rank that does
        the same thing.
    mismatch : str
        What differing descriptions mean, in the message (``the N ranks
        <mismatch>: who has what``).

    Raises
    ------
    The findings' own class, or ValueError when the descriptions differ
        On every rank.
    """
    size = comm.Get_size()
    if size == 1:
        if error is not None:
            raise as_exception(who, [(0, 1, error.kind.__name__, error.text)], 0)
        return
    code = digest(description)
    # the layout of agree()'s flags: any agreement step meets any other (a rank that failed before a call and
    # settles its failure meets the others' next agreement, whichever kind), and differing digests tell
    flags = numpy.array([0 if error is None else 1, code, -code, code, -code, 0, 0], dtype=numpy.int64)
    _reduce(comm, flags, who)
    if flags[0] == 0 and flags[1] == -flags[2]:
        return
    # agree()'s layout too (the parts on sub-communicators, then the call), so that the two meet
    everyone = collectives.allgather_object(comm, (None if error is None else (error.kind.__name__, error.text),
                                                   description, [], who))
    errors = [(r, size, e[0], e[1]) for r, (e, _, _, _) in enumerate(everyone) if e is not None]
    _raising(comm)
    if errors:
        raise as_exception(who, errors, comm.Get_rank())
    raise disagreement(who, size, mismatch, [d for _, d, _, _ in everyone], comm.Get_rank(),
                       whos=[w for _, _, _, w in everyone])


def raise_everywhere(comm, who, error):
    """The agreement of a call that will not run on this rank: the others raise ``error``'s finding too.

    Used for a call refused on this rank (another thread held the grid):
    collective over ``comm``, it always ends in the exception, which the
    caller may drop (the refusing rank has already raised its own).
    """
    agree(comm, who, error, "(refused)", signature="(refused)")


def agree_construction(obj, comm, who=None, error=None):
    """Collective over ``comm``: every rank built ``obj`` from the same arguments, or all raise.

    For objects whose parameters decide who talks to whom (a halo's widths
    and poles, the points of an interpolation) or what a model computes (a
    time step, a radius): agreed once, when they are built, whatever
    ``mpisphere.config.agreement`` says. The message names the ranks and
    their arguments (the largest group first, so the odd rank out is named
    alone).

    Raises
    ------
    ValueError
        On every rank, when the descriptions differ; ``error``'s kind when
        some rank passes a finding of its own.
    """
    who = who or (getattr(obj, "name", None) if isinstance(getattr(obj, "name", None), str)
                  else type(obj).__name__)
    if comm == MPI.COMM_NULL:  # a freed grid's communicator (free() is agreed: the same on every rank)
        raise RuntimeError(f"{who}: the grid was freed (grid.free()); build it on a live grid")
    settle(comm, who, error, description_of(obj),
           mismatch="built it from different arguments")
