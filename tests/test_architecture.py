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
    """The mpisphere modules ``path`` imports, as names like ``operators`` or ``sht.stages``."""
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
    assert "sht.stages" in internal_imports(PACKAGE / "sht" / "transforms.py")
    assert "settings" in internal_imports(PACKAGE / "cuda_aware.py")
