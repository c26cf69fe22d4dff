"""The documentation's structure: a short README whose links resolve, and an API page for every public name.

The site itself is built with warnings as errors and in nitpicky mode by ``.ci/docs`` (``sphinx-build -W -n``);
these serial checks catch what a build cannot: a public name added without a page, a module missing from the
internals page, a README that grows back into a manual.
"""

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import mpisphere

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api" / "index.rst").read_text()
INTERNALS = (ROOT / "docs" / "api" / "internals.rst").read_text()

# the packages whose __all__ the API reference lists (mpisphere.torch needs PyTorch: its names are checked as text)
DOCUMENTED = ["mpisphere.calculus", "mpisphere.io", "mpisphere.examples", "mpisphere.pylops_bridge",
              "mpisphere.interop"]


def listed(section_module):
    """The names the API page's autosummary lists after ``.. currentmodule:: section_module``."""
    names, current = set(), None
    for line in API.splitlines():
        found = re.match(r"\.\. currentmodule:: (\S+)", line)
        if found:
            current = found.group(1)
        elif current == section_module and re.match(r"   \w+$", line):
            names.add(line.strip())
    return names


def test_every_public_name_has_an_api_page():
    missing = {"mpisphere": set(mpisphere.__all__) - {"calculus"} - listed("mpisphere")}
    for name in DOCUMENTED:
        missing[name] = set(importlib.import_module(name).__all__) - listed(name)
    for name in ("torch", "torch_harmonics"):  # importing them needs PyTorch: their names are read as text
        tree = ast.parse((ROOT / "mpisphere" / f"{name}.py").read_text())
        names = next(set(ast.literal_eval(node.value)) for node in tree.body if isinstance(node, ast.Assign)
                     and any(getattr(t, "id", None) == "__all__" for t in node.targets))
        missing[f"mpisphere.{name}"] = names - listed(f"mpisphere.{name}")
    assert not any(missing.values()), f"public names without an API page: {missing}"


def test_every_module_is_on_the_internals_page():
    modules = ["mpisphere"] + [m.name for m in pkgutil.walk_packages(mpisphere.__path__, "mpisphere.")]
    documented = set(re.findall(r"\.\. automodule:: (\S+)", INTERNALS))
    assert not set(modules) - documented, f"modules missing from docs/api/internals.rst: {set(modules) - documented}"


def test_the_readme_is_a_first_visit_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150, len(text.splitlines())
    for heading in ("## Quickstart", "## Usage", "## Documentation"):
        assert heading in text
    broken = [target for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
              if not target.startswith("http") and not (ROOT / target).exists()]
    assert not broken, f"README links to files that do not exist: {broken}"
    assert "../shared" not in text


def test_every_guide_page_is_in_the_guide_toctree():
    index = (ROOT / "docs" / "guide" / "index.md").read_text()
    pages = {p.stem for p in (ROOT / "docs" / "guide").glob("*.md")} - {"index"}
    assert not {p for p in pages if f"\n{p}\n" not in index}


def test_the_ci_builds_the_docs_nitpicky_with_warnings_as_errors_and_checks_for_unrendered_markdown():
    script = (ROOT / ".ci" / "docs").read_text()
    builds = [line for line in script.splitlines() if line.lstrip().startswith("sphinx-build")]
    assert builds, ".ci/docs no longer builds the site"
    assert all(set(line.split()) >= {"-W", "-n", "-E"} for line in builds), builds
    assert ".ci/unrendered-markdown" in script
    # and once more with the torch extra installed (autodoc then reads PyTorch itself, not a mock)
    assert len(builds) >= 2 and "pip install -q '.[docs,torch]'" in script, builds
    assert "-n" in re.search(r"sphinx-build[^`\n]*", (ROOT / "README.md").read_text()).group().split()
    assert "docs" in (ROOT / ".ci" / "run").read_text()


def test_the_unrendered_markdown_check_finds_a_nested_link_and_passes_clean_pages(tmp_path):
    import subprocess
    import sys
    page = ('<p>Write and read speed: [<a href="../benchmarks.html">Benchmarks</a>](../benchmarks.md#writing)</p>'
            '<pre>```python\nx = [1](2)\n```</pre><p><code>**kwargs**</code> and <strong>bold</strong></p>')
    (tmp_path / "io.html").write_text(page)
    check = [sys.executable, str(ROOT / ".ci" / "unrendered-markdown"), str(tmp_path)]
    found = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert found.returncode == 1 and "io.html: a Markdown link" in found.stderr, found.stderr
    assert "code fence" not in found.stderr and "bold" not in found.stderr, found.stderr  # code is content
    (tmp_path / "io.html").write_text(page.replace("](../benchmarks.md#writing)", ""))
    assert subprocess.run(check, capture_output=True, text=True, timeout=60).returncode == 0


def test_user_facing_pages_name_no_internal_issue_numbers():
    """The pages, the README, the changelog and the docstrings speak of versions and dates, not of our issues."""
    pages = [p for p in (ROOT / "docs").rglob("*.md") if "results" not in p.parts]
    pages += [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "mpisphere").rglob("*.py")]
    found = [f"{p.relative_to(ROOT)}: {m.group()}" for p in pages
             for m in re.finditer(r"\b[Ii]ssues? #?\d+", p.read_text())]
    assert not found, found
