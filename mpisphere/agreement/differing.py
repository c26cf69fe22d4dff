"""What differs between the descriptions of ranks that disagree, named field by field.

The ranks compare descriptions such as ``DistributedRealSHT(grid=..., nlat=64,
...) forward: shape ('*', '*') float64 on host`` (an operator's call),
``{"root":1}`` (a ``Call``'s values) or
``HaloExchange(grid=..., rows=2, ...)`` (a construction). When they differ,
the whole descriptions (often hundreds of characters each) hide the one
field that does; ``what_differs`` names it::

    nlat: ranks 0-2 64, rank 3 65

A description is read as fields: the arguments of each ``Name(...)`` in it
(``nlat``, or ``GatherFrom.extent`` when several operators are composed), the
call after the arguments (``call``: ``forward``), what follows it
(``input``: the shape and dtype), a JSON object's keys, and the switches in
force (``switches``: ``; debug``). Text that cannot be read so is one field.
"""

import json
import re

__all__ = ["what_differs", "fields", "shown", "grouped", "ranks_text", "ARGUMENT", "VALUE", "INPUT", "CALL",
           "SWITCHES", "OPERATORS", "TEXT"]

_OPEN, _CLOSE = "([{", ")]}"
_HEAD = re.compile(r"([A-Za-z_][\w.]*)\(")
_SWITCHES = re.compile(r"((?:; (?:force_staging|debug))+)$")
_VALUE_CHARS = 48  # a value longer than this is shortened in the first line (the details show it whole)
_MACHINE = "machine("


def ranks_text(ranks):
    """``"rank 3"``, ``"ranks 0-2"``, ``"ranks 1, 3"`` (``"no rank"`` for none)."""
    ranks = sorted(ranks)
    if not ranks:
        return "no rank"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")


def grouped(texts, ranks=None):
    """``[(text, ranks)]`` of equal ``texts`` (one per rank), the largest group first (ties: the lowest rank)."""
    ranks = list(range(len(texts))) if ranks is None else list(ranks)
    groups = {}
    for r, text in zip(ranks, texts):
        groups.setdefault(text, []).append(r)
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))


def _unquoted(text, start=0):
    """``(index, depth)`` of each character of ``text`` from ``start`` outside quotes.

    ``depth`` is the number of brackets open after the character: a closing
    bracket reports the depth it returns to (never below 0).
    """
    depth, quote, i = 0, None, start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        else:
            depth = depth + 1 if c in _OPEN else max(0, depth - 1) if c in _CLOSE else depth
            yield i, depth
        i += 1


def _split_top(text, separator):
    """``text`` split at ``separator`` where it is outside brackets and quotes."""
    parts, start = [], 0
    for i, depth in _unquoted(text):
        if i >= start and depth == 0 and text[i] not in _CLOSE and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i + len(separator)
    parts.append(text[start:])
    return parts


def _closing(text, start):
    """The index of the bracket that closes the one at ``start`` (quotes respected), or -1."""
    for i, depth in _unquoted(text, start):
        if depth == 0 and text[i] in _CLOSE:
            return i
    return -1


def _arguments(prefix, inner, out, kind):
    """The fields of ``Name(inner)``: ``key=value`` by key, ``other(...)`` by its name, the rest by position."""
    for index, item in enumerate(_split_top(inner, ", ")):
        item = item.strip()
        if not item:
            continue
        key, eq, value = item.partition("=")
        if eq and _split_top(key, "(") == [key] and "'" not in key and '"' not in key:
            out.append((f"{prefix}{key.strip()}", value.strip(), kind))
            continue
        head = _HEAD.match(item)
        out.append((f"{prefix}{head.group(1) if head else f'#{index}'}", item, kind))


def _is_arguments(text):
    """Whether ``text`` is ``key=value, ...`` throughout (a call's parameters written after it)."""
    items = [i.strip() for i in _split_top(text, ", ")]
    return bool(text.strip()) and all(re.match(r"^[A-Za-z_]\w*=", i) for i in items)


def _json_fields(prefix, values, out):
    """A JSON object's fields, nested objects by dotted keys (``history.step``)."""
    for key, value in sorted(values.items()):
        if isinstance(value, dict) and value:
            _json_fields(f"{prefix}{key}.", value, out)
        else:
            out.append((f"{prefix}{key}", json.dumps(value, sort_keys=True, separators=(",", ":")), VALUE))


# the kinds of field: an object's constructor argument, a call's value (given to the call itself), the input's
# shape and dtype, the call made, the switches in force, the operators named, text read as a whole
ARGUMENT, VALUE, INPUT, CALL, SWITCHES, OPERATORS, TEXT = ("argument", "value", "input", "call", "switches",
                                                          "operators", "text")


def fields(text):
    """``[(key, value, kind)]``: the fields of one description (see the module docstring and the kinds above)."""
    out = []
    switches = _SWITCHES.search(text)
    if switches:
        text = text[:switches.start()]
    out.append(("switches", switches.group(1).lstrip("; ") if switches else "none", SWITCHES))
    if text.startswith("{"):
        try:
            values = json.loads(text)
        except ValueError:
            values = None
        if isinstance(values, dict):
            _json_fields("", values, out)
            return out
    segments = _split_top(text, " | ")
    for s, segment in enumerate(segments):
        prefix = f"part {s + 1}: " if len(segments) > 1 else ""
        calls, rest, position = [], [], 0
        for found in _HEAD.finditer(segment):
            if found.start() < position:
                continue
            end = _closing(segment, found.end() - 1)
            if end < 0:
                break
            rest.append(segment[position:found.start()])
            calls.append((found.group(1), segment[found.end():end]))
            position = end + 1
        tail = segment[position:]
        names = [name for name, _ in calls]
        out.append((f"{prefix}operators", " ".join(w for r, name in zip(rest, names) for w in (r.strip(), name) if w),
                    OPERATORS))
        for name, inner in calls:
            _arguments(prefix + (f"{name}." if len(calls) > 1 and names.count(name) == 1 else ""), inner, out,
                       ARGUMENT)
        call, *after = _split_top(tail.strip(), ": ")  # the call may carry a bracketed note with a colon
        colon, given = bool(after), ": ".join(after)
        if not calls:
            out.append((f"{prefix}text", segment.strip(), TEXT))
        elif colon or call:
            out.append((f"{prefix}call", call, CALL))
            if _is_arguments(given):
                _arguments(prefix, given, out, VALUE)
            else:
                out.append((f"{prefix}input", given, INPUT))
    return out


def _short(value):
    value = " ".join(value.split())
    return value if len(value) <= _VALUE_CHARS else value[:_VALUE_CHARS - 3] + "..."


def what_differs(texts, ranks=None):
    """``(summary, fields)``: the fields whose values differ between ``texts`` (one per rank), named by rank.

    ``summary`` is ``"nlat: ranks 0-2 64, rank 3 65"`` (fields joined by
    ``"; "``, at most four, the largest group of ranks first), or ``""``
    when the texts cannot be compared field by field (a different number of
    parts or operators: then they describe different calls) or do not
    differ. ``fields`` are the differing fields as ``(key, kind)``.
    """
    ranks = list(range(len(texts))) if ranks is None else list(ranks)
    parsed = [fields(t) for t in texts]
    layouts = {tuple(k for k, _, _ in p if "#" not in k) for p in parsed}
    if len(layouts) != 1 or len(set(texts)) < 2:
        return "", []
    by_key, kinds = {}, {}
    for r, p in zip(ranks, parsed):
        for k, v, kind in p:
            by_key.setdefault(k, {})[r] = v
            kinds[k] = kind
    parts, found = [], []
    for key, values in by_key.items():
        if len(set(values.values())) < 2 or len(values) != len(ranks):
            continue
        found.append((key, kinds[key]))
        groups = grouped([values[r] for r in ranks], ranks)
        parts.append(f"{key}: " + ", ".join(f"{ranks_text(rs)} {_short(v) or '(none)'}" for v, rs in groups[:4])
                     + (f", and {len(groups) - 4} more" if len(groups) > 4 else ""))
    if not parts:
        return "", []
    summary = "; ".join(parts[:4]) + (f"; and {len(parts) - 4} more fields" if len(parts) > 4 else "")
    return summary, found


def shown(text, keep_machine=False):
    """``text`` for the details of a message: a transform's measured machine profile left out unless it differs."""
    if keep_machine:
        return text
    out, position = [], 0
    while True:
        start = text.find(_MACHINE, position)
        if start < 0 or (start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_")):
            if start < 0:
                out.append(text[position:])
                return "".join(out)
            out.append(text[position:start + 1])
            position = start + 1
            continue
        end = _closing(text, start + len(_MACHINE) - 1)
        if end < 0:
            out.append(text[position:])
            return "".join(out)
        out.append(text[position:start] + "machine(...)")
        position = end + 1
