"""Every Python example of the documentation runs: the guide's pages, the getting-started page and the README.

Each ```` ```python ```` block of a page runs standalone, in a namespace
of its own (a reader copies one block, not the page), in page order, under
``mpiexec`` at the number of ranks the block asks for: a
block whose first line is ``# mpiexec -n N`` runs in the ``N``-rank launch
(with the page's other ``N``-rank blocks), every other block in the one-rank
launch. A block whose first lines say ``# needs: torch`` (or another
importable name) runs where that is installed; with
``MPISPHERE_REQUIRE_TORCH=1`` (CI's torch job) a missing torch fails
instead. The blocks run in a directory shared by the ranks, so examples that
write files do not litter the checkout.

Only ``python`` blocks run; shell lines and program output are ``bash`` and
``text`` blocks.
"""

import importlib.util
import os
import re
from pathlib import Path

import pytest

from mpisphere.testing import world_size

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```", re.S | re.M)
RANKS = re.compile(r"^# mpiexec -n (\d+)")
NEEDS = re.compile(r"^# needs: ([\w.]+)", re.M)


def pages():
    """The documentation's Markdown pages that hold Python examples (README.md first)."""
    found = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md")
                                          if not {"_build", "results"} & set(p.parts))
    return [p for p in found if BLOCK.search(p.read_text())]


def examples(page):
    """``[(ranks, needs, code, line)]`` of the page's Python blocks."""
    text = page.read_text()
    out = []
    for match in BLOCK.finditer(text):
        code = match.group(1)
        ranks = RANKS.match(code)
        out.append((int(ranks.group(1)) if ranks else 1, NEEDS.findall(code), code,
                    text.count("\n", 0, match.start(1)) + 1))
    return out


LAUNCHED = (1, 2, 3, 4, 6)  # the rank counts an example may name: each runs at its own


def sessions(size):
    """``{(page, ranks): blocks}`` for the pages' blocks that run on ``size`` ranks."""
    found = {}
    for page in pages():
        for ranks, needs, code, line in examples(page):
            if ranks == size:
                found.setdefault(str(page.relative_to(ROOT)), []).append((needs, code, line))
    return found


def pytest_generate_tests(metafunc):
    if "session" in metafunc.fixturenames:
        found = sessions(world_size(metafunc.config))
        metafunc.parametrize("session", sorted(found.items()), ids=sorted(found))


def test_every_example_names_a_rank_count_the_suite_launches():
    launched = set(LAUNCHED)
    odd = [(str(page.relative_to(ROOT)), line, ranks) for page in pages()
           for ranks, _, _, line in examples(page) if ranks not in launched]
    assert not odd, f"examples asking for rank counts the suite never launches (page, line, ranks): {odd}"


@pytest.mark.mpi
@pytest.mark.also_at(*LAUNCHED)  # every example at the rank count it names, also in the default matrix
def test_the_examples_of_a_page_run(session, tmp_path, comm):
    page, blocks = session
    shared = comm.bcast(str(tmp_path), root=0)
    here = os.getcwd()
    shown_only = []
    os.chdir(shared)
    try:
        for needs, code, line in blocks:
            missing = [name for name in needs if importlib.util.find_spec(name) is None]
            if missing:
                if os.environ.get("MPISPHERE_REQUIRE_TORCH") == "1" and "torch" in missing:
                    pytest.fail(f"{page}:{line} needs torch, which is not installed (MPISPHERE_REQUIRE_TORCH=1)")
                shown_only.append(f"line {line} ({', '.join(missing)})")
                continue
            namespace = {"__name__": "__docs_example__"}  # standalone: nothing from the page's other blocks
            try:
                # compiled under the page's own path and line numbers, so a failure points into the page
                exec(compile("\n" * (line - 1) + code, str(ROOT / page), "exec"), namespace)
            finally:
                for value in list(namespace.values()):  # the block's grids, if it kept them
                    if type(value).__name__ == "ProcessGrid" and not value.freed:
                        value.free()
    finally:
        os.chdir(here)
    if shown_only:
        pytest.skip(f"{page}: the other blocks ran; not installed here for {'; '.join(shown_only)}")
