"""The agreement over a communicator: per call (``agree``) or once at construction, and its errors."""


import numpy
from mpi4py import MPI

from .. import collectives, cuda_aware
from ..settings import config
from .description import call_description, description_of, digest
from .spec import Context
from .stall import wait


def differences(texts, ranks=None):
    """A message naming who has what, when ``texts`` (one per rank) are not all equal; ``""`` otherwise.

    The largest group is named first, so with more than two ranks the odd
    one out is the rank named alone.
    """
    ordered = _grouped(texts, ranks)
    if len(ordered) < 2:
        return ""
    parts = [f"{_ranks(rs)} {'has' if len(rs) == 1 else 'have'}: {d}" for d, rs in ordered[:4]]
    return " | ".join(parts) + (f" | and {len(ordered) - 4} more variants" if len(ordered) > 4 else "")


def odd_ones(texts, ranks=None):
    """The ranks outside the largest group of equal ``texts`` (``"rank 3"``, ``"ranks 1, 3"``), or ``None``."""
    ordered = _grouped(texts, ranks)
    if len(ordered) < 2:
        return None
    return _ranks(sorted(r for _, rs in ordered[1:] for r in rs))


def _grouped(texts, ranks=None):
    """``[(text, ranks)]`` of equal ``texts`` (one per rank), the largest group first (ties: the lowest rank)."""
    ranks = list(range(len(texts))) if ranks is None else ranks
    groups = {}
    for r, text in zip(ranks, texts):
        groups.setdefault(text, []).append(r)
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))


def cause_first(text, after):
    """A finding's cause (its first line); its other lines (what to do, details) go onto ``after``, each once."""
    cause, *rest = text.split("\n")
    after.extend(line for line in rest if line not in after)
    return cause


def _ranks(ranks):
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")


_KINDS = {"TypeError": TypeError, "RuntimeError": RuntimeError, "MemoryError": MemoryError, "OSError": OSError,
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
    cls = _KINDS.get(next(iter(kinds)), ValueError) if len(kinds) == 1 else ValueError
    size = errors[0][1]
    groups = {}
    after = []  # the lines after the causes (what to do, then each rank's details), each different line once
    for r, _, _, text in errors:
        groups.setdefault(cause_first(text, after), []).append(r)
    items = list(groups.items())
    shown = " | ".join(f"{_ranks(ranks)} of {size}: {cause}" for cause, ranks in items[:4])
    rest = sum(len(ranks) for _, ranks in items[4:])
    more = f" | and {rest} more rank{'s' if rest > 1 else ''}" if rest else ""
    if len(after) > 12:
        after = after[:11] + [f"  ... and {len(after) - 11} more lines"]
    message = f"{who}: {shown}{more}" + "".join(f"\n{line}" for line in after)
    reporter = min(r for r, _, _, _ in errors)
    return printed_once(cls(message), who, rank, reporter, f"{_ranks(items[0][1])} of {size}: {items[0][0]}")


def printed_once(exc, who, rank, reporter, cause):
    """``exc`` as raised on ``rank``: its whole message on ``reporter``, one line naming ``reporter`` elsewhere.

    Under ``mpiexec`` every rank's traceback reaches the terminal; the whole
    message (often several hundred characters, the same on every rank) is
    printed once. Every rank keeps it as ``exc.mpisphere_message``, and
    ``exc.mpisphere_reporter`` names the rank that prints it. ``rank=None``
    (one process, or a caller that prints nothing) keeps the whole message.
    """
    exc.mpisphere_message = str(exc)
    exc.mpisphere_reporter = reporter
    if rank is not None and rank != reporter:
        line = " ".join(cause.split())
        line = line if len(line) <= 160 else line[:157] + "..."
        exc.args = (f"{who}: {line} [the whole message: rank {reporter}'s error]",)
    return agreed(exc)


def agreed(exc):
    """``exc`` marked as raised by every rank of one agreement (``exc.mpisphere_agreed``).

    A caller cleaning up after it (a checkpoint's ``__exit__``) knows that
    every rank left at the same step and needs no further step of its own.
    """
    exc.mpisphere_agreed = True
    return exc


def disagreement(who, size, mismatch, problems, rank, odd=None):
    """The ValueError of ranks whose descriptions differ, printed in full by rank 0 (:func:`printed_once`).

    ``odd`` names the ranks that differ from the largest group, for the one
    line the other ranks print.
    """
    exc = ValueError(f"{who}: the {size} ranks {mismatch}: {problems}")
    cause = f"the {size} ranks {mismatch}" + (f" ({odd} differ{'s' if odd.startswith('rank ') else ''})" if odd else "")
    return printed_once(exc, who, rank, 0, cause)


# --- over a communicator -------------------------------------------------------------------------------

def _group_id(comm, space):
    """The space rank of ``comm``'s rank 0: the same on every member of ``comm``, different between groups."""
    if comm is space:
        return 0
    return int(MPI.Group.Translate_ranks(comm.Get_group(), [0], space.Get_group())[0])


def _reduce(comm, flags, who):
    """The agreement's one reduction (elementwise maximum, in place), watched for a rank that never arrives."""
    wait(collectives.iallreduce_max_ints(comm, flags), comm, who)


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
    flags = numpy.array([0 if error is None else 1, code, -code, everything, -everything, not_aware],
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
                for c, text in parts if c is not comm]))
    errors = [(r, size, e[0], e[1]) for r, (e, _, _) in enumerate(everyone) if e is not None]
    if errors:
        raise as_exception(who, errors, comm.Get_rank())
    problems = differences([d for _, d, _ in everyone])
    odd = odd_ones([d for _, d, _ in everyone])
    if not problems:  # the ranks agree here: find the groups of a sub-communicator that do not
        for index in range(min(len(parts_of) for _, _, parts_of in everyone)):
            group_of = {}
            for r, (_, _, subparts) in enumerate(everyone):
                where, text = subparts[index]
                if where is not None:
                    group_of.setdefault(where, {})[r] = text
            for (name, _), members in group_of.items():
                found = differences([members[r] for r in sorted(members)], sorted(members))
                if found:
                    problems = f"within {name} " + found
                    odd = odd_ones([members[r] for r in sorted(members)], sorted(members))
                    break
            if problems:
                break
    if not problems:  # debug mode compared everything and found it equal
        return context
    raise disagreement(who, size, "disagree on what they are about to do", problems, comm.Get_rank(), odd)


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
    flags = numpy.array([0 if error is None else 1, code, -code, code, -code, 0], dtype=numpy.int64)
    _reduce(comm, flags, who)
    if flags[0] == 0 and flags[1] == -flags[2]:
        return
    # agree()'s layout too (its third member: the parts on sub-communicators), so that the two meet
    everyone = collectives.allgather_object(comm, (None if error is None else (error.kind.__name__, error.text),
                                                   description, []))
    errors = [(r, size, e[0], e[1]) for r, (e, _, _) in enumerate(everyone) if e is not None]
    if errors:
        raise as_exception(who, errors, comm.Get_rank())
    texts = [d for _, d, _ in everyone]
    raise disagreement(who, size, mismatch, differences(texts), comm.Get_rank(), odd_ones(texts))


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
    settle(comm, who, error, description_of(obj),
           mismatch="built it from different arguments (build it the same way on every rank)")
