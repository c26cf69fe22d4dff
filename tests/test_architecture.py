"""The layer order of docs/architecture.md, checked against every import in the package (serial)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mpisphere"


def documented_order():
    """Module names in the order of the table in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    return [m for m in re.findall(r"^\| *\d+ *\| `([\w.]+)` \|", text, flags=re.M)]


def module_name(path):
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def internal_imports(path):
    """The mpisphere modules ``path`` imports, as names like ``operators`` or ``stages.pipeline``."""
    name = module_name(path)
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    if name == "__init__":
        package = []
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join(base + ([node.module] if node.module else []))
                candidates = [target] if node.module else []
                candidates += [f"{target}.{alias.name}".lstrip(".") for alias in node.names]
            elif node.module and node.module.split(".")[0] == "mpisphere":
                target = node.module[len("mpisphere"):].lstrip(".")
                candidates = [target] + [f"{target}.{alias.name}".lstrip(".") for alias in node.names]
            else:
                continue
            for candidate in candidates:
                if (PACKAGE / (candidate.replace(".", "/") + ".py")).exists() or \
                        (PACKAGE / candidate.replace(".", "/") / "__init__.py").exists():
                    found.add(candidate or "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mpisphere."):
                    found.add(alias.name[len("mpisphere."):])
    found.discard(name)
    return found


def test_every_module_is_placed_in_the_documented_order():
    order = documented_order()
    assert len(order) == len(set(order)), "a module is listed twice in docs/architecture.md"
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    missing = sorted(modules - set(order))
    assert not missing, f"modules not placed in docs/architecture.md's table: {missing}"
    stale = sorted(set(order) - modules)
    assert not stale, f"docs/architecture.md lists modules that do not exist: {stale}"


def test_a_long_module_names_its_one_job():
    """No module above 500 lines unless its row in docs/architecture.md says which one job it holds."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = dict(re.findall(r"^\| *\d+ *\| `([\w.]+)` \|(.*)$", text, flags=re.M))
    long = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    wrong = [f"{name} ({lines} lines)" for name, lines in sorted(long.items())
             if lines > 500 and "(one job:" not in rows.get(name, "")]
    assert not wrong, "modules over 500 lines whose row does not name their one job: " + ", ".join(wrong)


def test_no_module_imports_a_module_below_it():
    order = documented_order()
    rank = {name: i for i, name in enumerate(order)}
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        for target in internal_imports(path):
            if target in rank and rank[target] >= rank[name]:
                wrong.append(f"{name} (#{rank[name] + 1}) imports {target} (#{rank[target] + 1})")
    assert not wrong, "imports against the layer order of docs/architecture.md:\n" + "\n".join(wrong)


def test_the_checker_sees_relative_and_absolute_imports(tmp_path):
    """The parser itself: a relative import two levels up and an absolute one are both found."""
    assert "operators" in internal_imports(PACKAGE / "sht" / "transforms.py")
    assert "stages.pipeline" in internal_imports(PACKAGE / "sht" / "transforms.py")
    assert "settings" in internal_imports(PACKAGE / "cuda_aware.py")


# --- every MPI call goes through collectives -----------------------------------------------------------

# mpi4py methods that communicate, create or free communicators, or complete requests. The lower-case names
# that are also common Python words (gather, scatter, reduce, send, recv, probe) are left out: mpisphere's own
# grid.gather / grid.scatter would match them.
MPI_METHODS = {
    "Send", "Recv", "Isend", "Irecv", "Ssend", "Issend", "Sendrecv", "Sendrecv_replace", "Bsend", "Rsend",
    "isend", "irecv", "sendrecv", "Bcast", "bcast", "Ibcast", "Scatter", "Scatterv", "Gather", "Gatherv",
    "Allgather", "Allgatherv", "allgather", "Iallgather", "Iallgatherv", "Alltoall", "Alltoallv", "Alltoallw",
    "alltoall", "Ialltoall", "Ialltoallv", "Reduce", "Allreduce", "allreduce", "Iallreduce", "Reduce_scatter",
    "Reduce_scatter_block", "Scan", "Exscan", "Barrier", "barrier", "Ibarrier", "Probe", "Iprobe", "Mprobe",
    "Improbe", "iprobe", "Wait", "Waitall", "Waitany", "Waitsome", "Test", "Testall", "Testany", "Cancel",
    "Split", "Split_type", "Dup", "Create_cart", "Create_graph", "Sub", "Free", "Abort",
    "Neighbor_allgather", "Neighbor_allgatherv", "Neighbor_alltoall", "Neighbor_alltoallv",
    "Send_init", "Recv_init", "Psend_init", "Precv_init", "Start", "Startall", "Allocate_shared", "Shared_query",
    "Lock_all", "Unlock_all", "Sync",
}
# the modules that may call them: the wrappers, host staging, the CUDA-aware decision, the grid's own
# communicators, and the test harness (it must keep working, on a private communicator, when the library fails)
MAY_CALL_MPI = {"collectives", "staging", "cuda_aware", "grid", "testing.inner"}


def mpi_calls(path):
    """``(line, method)`` of every call of an mpi4py communication method in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MPI_METHODS:
            receiver = node.func.value
            if isinstance(receiver, ast.Name) and receiver.id == "collectives":
                continue  # the wrappers themselves
            found.append((node.lineno, node.func.attr))
    return found


def test_only_the_named_modules_call_mpi():
    wrong = []
    sources = sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "examples").rglob("*.py"))
    for path in sources:
        inside = path.is_relative_to(PACKAGE)
        if inside and module_name(path) in MAY_CALL_MPI:
            continue
        wrong += [f"{path.relative_to(ROOT)}:{line}: {method}" for line, method in mpi_calls(path)]
    assert not wrong, ("MPI called outside mpisphere.collectives (and staging, cuda_aware, grid construction, "
                       "the test harness); go through a collectives wrapper or an operator:\n" + "\n".join(wrong))


def test_the_mpi_checker_sees_calls(tmp_path):
    """The checker itself: a method call on a communicator is found, a grid's own gather is not."""
    sample = tmp_path / "sample.py"
    sample.write_text("comm.Allreduce(a, b)\nrequest.Wait()\ngrid.gather(tile)\nx = comm.Get_rank()\n"
                      "collectives.allreduce(comm, a, b)\n")
    assert mpi_calls(sample) == [(1, "Allreduce"), (2, "Wait")]


# --- one dtype policy, one cache --------------------------------------------------------------------------

# what only mpisphere.dtypes may spell out (the complex and real partners of a dtype), and the hand-written
# first-in-first-out cache that backend.BoundedCache replaces
OWN_RULES = {
    "a complex partner of a dtype written out (use dtypes.complex_of)": re.compile(r"result_type\([^)]*complex64"),
    "a real partner of a dtype written out (use dtypes.real_of)": re.compile(r"\.real\.dtype\b"),
    "a hand-written bounded cache (use backend.BoundedCache)": re.compile(r"len\(self\.\w+\) >= \d+"),
    "a dtype table written out (use dtypes.ROLES and validation.check_dtype)":
        re.compile(r"dtype(?:\.name)? (?:not )?in \(|dtype must be (?:float|real|complex)"),
    "an integer check written out (use validation.check_int)": re.compile(r"operator\.index\(|must be an integer"),
    "a choice check written out (use validation.check_choice)": re.compile(r"must be one of|choose one of"),
    "a test of a ProcessGrid written out (use validation.is_process_grid or check_process_grid)":
        re.compile(r"""hasattr\([\w.]+, ["'](?:cart|npolar|nazimuth|polar_neighbors|holding|local_slices)["']\)"""),
    "a call guard's protocol written out (use agreement.guarded)": re.compile(r"\.enter\(\w*\)|guard\.leave\(\)"),
    "another object's private _run called (use its run_agreed)": re.compile(r"(?<!\bself)(?<!\(\))\._run\("),
}
RULE_HOMES = {"dtypes", "backend", "validation", "agreement.guard"}


def test_dtype_tables_checks_and_caches_live_in_their_modules():
    """One dtype policy, one validation layer, one bounded cache: the architecture refuses second copies."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if module_name(path) in RULE_HOMES:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            wrong += [f"{path.relative_to(ROOT)}:{number}: {what}" for what, rule in OWN_RULES.items()
                      if rule.search(line)]
    assert not wrong, "\n".join(wrong)


def test_the_rules_see_second_copies():
    """The patterns themselves: each finds the hand-written form it names."""
    samples = {
        "a complex partner": "numpy.result_type(d, numpy.complex64)",
        "a real partner": "x.real.dtype",
        "a hand-written bounded cache": "if len(self._plans) >= 8:",
        "a dtype table": "if dtype not in (numpy.float32, numpy.float64):",
        "an integer check": "n = operator.index(n)",
        "a choice check": "raise ValueError(f'norm must be one of {NORMS}')",
        "a test of a ProcessGrid": 'if not (hasattr(grid, "cart") and hasattr(grid, "npolar")):',
        "a call guard's protocol": "if not guard.enter(refusal):",
        "another object's private _run": "self.halo._run(FORWARD, x, out, context)",
    }
    for start, line in samples.items():
        found = [what for what, rule in OWN_RULES.items() if rule.search(line)]
        assert len(found) == 1 and found[0].startswith(start), (line, found)


# --- findings before the agreement; one home per Legendre strategy -------------------------------------------

def findings_while_running(path):
    """``(line, function)`` of every ``raise InputError(...)`` inside a method that runs after the agreement.

    ``_run`` and its helpers (``_run_*``) do the work once every rank has
    agreed: a finding there would be raised on one rank only (the others are
    already communicating), and as mpisphere's internal record. Checks
    belong in ``_output`` (or a ``_check_*``), before the agreement.
    """
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("_run"):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Raise) and isinstance(inner.exc, ast.Call) and \
                        getattr(inner.exc.func, "id", getattr(inner.exc.func, "attr", None)) == "InputError":
                    found.append((inner.lineno, node.name))
    return found


def test_no_finding_is_raised_after_the_agreement():
    wrong = [f"{path.relative_to(ROOT)}:{line}: raise InputError in {name}"
             for path in sorted(PACKAGE.rglob("*.py")) for line, name in findings_while_running(path)]
    assert not wrong, "checks made while running (move them to _output, before the agreement):\n" + "\n".join(wrong)


def test_the_finding_checker_sees_a_late_check(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("class A:\n    def _output(self, d, s):\n        raise InputError('fine')\n"
                      "    def _run_columns(self, d, x, out):\n        raise InputError('late', TypeError)\n")
    assert findings_while_running(sample) == [(5, "_run_columns")]


def test_each_legendre_strategy_lives_in_its_own_record():
    """The transforms ask the strategy records, never compare strategy names (a new strategy is one file)."""
    names = re.compile(r"""[!=]=\s*["'](transpose|reduce-scatter|table-free)["']|["'](transpose|reduce-scatter|"""
                       r"""table-free)["']\s*[!=]=""")
    homes = {"sht.strategies", "sht.strategies.base", "sht.strategies.transpose", "sht.strategies.reduce_scatter",
             "sht.strategies.table_free"}
    wrong = lines_outside(names, homes)
    assert not wrong, "a Legendre strategy named outside its record:\n" + "\n".join(wrong)


def lines_outside(pattern, homes):
    """``path:line: text`` of every line of the package outside the modules ``homes`` that ``pattern`` finds."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if module_name(path) in homes:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                wrong.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return wrong


# --- one protocol for the collective calls outside the operators -------------------------------------------

# where an agreement may be written out: the agreement itself, the operators' protocol (LinearOperator._apply) and
# the halo's agreement with its neighbours (its _agreement override)
AGREEMENT_HOMES = {"agreement", "agreement.collective", "agreement.call", "halo.round", "agreement.stall",
                   "operators.base", "halo.exchange"}
HAND_WRITTEN = {"agree", "settle"}


def _called_name(node):
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def hand_written_agreements(path):
    """``(line, name)`` of every call of ``agree(...)`` or ``settle(...)`` (not ``call.agree``) in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in HAND_WRITTEN:
            found.append((node.lineno, node.func.id))
    return found


def unmarked_collective_methods(path):
    """``(line, Class.method)`` of public methods that run a ``Call`` or call ``collectives`` without ``@collective``.

    Operators (classes with ``_run``/``_output``, the protocol of ``LinearOperator._apply``) and constructors are
    left out: an operator's public calls go through ``_apply``, a constructor agrees with ``agree_construction``.
    """
    found = []
    for cls in ast.walk(ast.parse(path.read_text())):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = [m for m in cls.body if isinstance(m, ast.FunctionDef)]
        if any(m.name in ("_run", "_output") for m in methods):
            continue
        for method in methods:
            public = not method.name.startswith("_") or method.name in ("__enter__", "__exit__")
            if not public:
                continue
            talks = any(isinstance(n, ast.Call) and (_called_name(n) == "Call" or (
                isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                and n.func.value.id == "collectives")) for n in ast.walk(method))
            marked = any((isinstance(d, ast.Name) and d.id == "collective") for d in method.decorator_list)
            if talks and not marked:
                found.append((method.lineno, f"{cls.name}.{method.name}"))
    return found


# classes whose public methods communicate as part of a call agreed elsewhere: the protocol's own machinery, a
# transpose in flight (agreed when it was started; wait() and test() complete it), and the halo's two links and
# node memory (parts of an exchange's call, or of its allocation through HaloExchange.zeros), and the failure notes
# (point-to-point notes sent and read inside the calls whose end they raise at)
AGREED_ELSEWHERE = {"agreement.call", "halo.round", "agreement.stall", "agreement.failures",
                    "transpose.Exchange", "attention.gather.NeighbourGather",
                    "halo.absent", "halo.plan.MessagePlan", "halo.planned.PlannedCall", "halo.shared.NodeMemory",
                    "halo.shared_link.SharedLink", "halo.message_link.MessageLink", "halo.links"}


def test_every_collective_call_runs_the_one_protocol():
    """No agreement written by hand outside its homes; every public collective method marked ``@collective``."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name not in AGREEMENT_HOMES:
            wrong += [f"{path.relative_to(ROOT)}:{line}: {called}(...) by hand (use agreement.Call)"
                      for line, called in hand_written_agreements(path)]
        if name in AGREED_ELSEWHERE:
            continue
        wrong += [f"{path.relative_to(ROOT)}:{line}: {method} communicates without @collective"
                  for line, method in unmarked_collective_methods(path)
                  if f"{name}.{method.split('.')[0]}" not in AGREED_ELSEWHERE]
    assert not wrong, "collective calls outside the protocol:\n" + "\n".join(wrong)


def test_the_protocol_checker_sees_both_mistakes(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("class Store:\n"
                      "    def write(self):\n        call = Call(self.comm, 'w')\n        call.agree()\n"
                      "    @collective\n    def read(self):\n        return Call(self.comm, 'r').root(f)\n"
                      "    def local(self):\n        return 1\n"
                      "def helper(comm):\n    settle(comm, 'x', None)\n")
    assert unmarked_collective_methods(sample) == [(2, "Store.write")]
    assert hand_written_agreements(sample) == [(11, "settle")]


# --- tilings answer for their kind; small modules -------------------------------------------------------

TILING_KINDS = re.compile(r"isinstance\([^)]*\b(?:RegularTiling|RingTiles)\b")
TILING_HOMES = {"tiling", "ring_tiles"}


def test_no_module_tests_a_tilings_kind():
    """The model, the interpolation and the store ask a tiling (``points``, ``transforms``, ``stencil``,
    ``write_to``) instead of testing which kind it is: a new kind of grid is a new tiling, not a case in each."""
    wrong = lines_outside(TILING_KINDS, TILING_HOMES)
    assert not wrong, "tests of a tiling's kind outside the tiling modules:\n" + "\n".join(wrong)


def test_the_tiling_rule_sees_a_kind_test():
    assert TILING_KINDS.search("if isinstance(tiling, RegularTiling):")
    assert TILING_KINDS.search("elif isinstance(tiles, (RingTiles, Other)):")
    assert not TILING_KINDS.search("if isinstance(grid, Tiling):")


CODE_LINES = 350


def code_lines(source):
    """The lines of ``source`` that hold code: not blank, not comments, not docstrings."""
    import io
    import tokenize
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body and \
                isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) and \
                isinstance(node.body[0].value.value, str):
            docstrings.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docstrings)
    return len(lines)


def test_no_module_holds_more_than_350_lines_of_code():
    """A module past 350 lines of code (docstrings and comments aside) holds two jobs: split it."""
    long = {module_name(p): code_lines(p.read_text()) for p in PACKAGE.rglob("*.py")}
    wrong = [f"{name} ({n} lines of code)" for name, n in sorted(long.items()) if n > CODE_LINES]
    assert not wrong, f"modules over {CODE_LINES} lines of code: " + ", ".join(wrong)


def test_the_line_counter_leaves_out_docstrings_and_comments():
    source = ('"""Doc.\n\nMore."""\n\n# a comment\nx = 1  # trailing\n\n\n'
              'def f():\n    """Doc."""\n    return (1,\n            2)\n')
    assert code_lines(source) == 4  # x = 1; def f():; the two lines of the return
