"""The repository's layout: an import graph without circles, documentation whose links and
named files exist, and the size limits of the README and the study tools."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("csa_jax", "environments", "experiments", "studies", "benchmarks")
DOCS = ["README.md"] + sorted(os.path.join("docs", f)
                              for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))


def _modules() -> dict[str, str]:
  """Dotted module name -> file, for the packages and launch.py."""
  out = {"launch": os.path.join(ROOT, "launch.py")}
  for pkg in PACKAGES:
    for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
      for f in files:
        if f.endswith(".py"):
          rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
          out[rel.removesuffix(".__init__")] = os.path.join(dirpath, f)
  return out


def import_graph() -> dict[str, set[str]]:
  """Module -> the project's modules it imports anywhere in its file (a function's lazy
  import too): `from a import b` counts as importing a.b where that is a module, else a."""
  mods = _modules()

  def resolve(name: str) -> str | None:
    while name and name not in mods:
      name = name.rpartition(".")[0]
    return name or None

  graph = {}
  for mod, path in mods.items():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets |= {resolve(a.name) for a in node.names}
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(parts + ([base] if base else []))
        targets |= {resolve(f"{base}.{a.name}") for a in node.names}
    graph[mod] = {t for t in targets if t and t != mod}
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while not comp or comp[-1] != v:
        comp.append(stack.pop())
        on_stack.discard(comp[-1])
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_cycles_finds_a_circle():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
  assert cycles(import_graph()) == []


def _slug(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS)
def test_links_and_named_files_exist(doc):
  """Every relative link (and its #anchor) resolves, and every repository path the page
  names in backticks exists: moving a module or a section must move its references."""
  with open(os.path.join(ROOT, doc)) as f:
    text = f.read()
  missing = []
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if target.startswith(("http://", "https://")):
      continue
    path, _, anchor = target.partition("#")
    full = os.path.normpath(os.path.join(ROOT, os.path.dirname(doc), path)) if path else \
        os.path.join(ROOT, doc)
    if not os.path.exists(full):
      missing.append(target)
    elif anchor:
      with open(full) as f:
        if anchor not in {_slug(h) for h in re.findall(r"^#+ (.*)$", f.read(), re.M)}:
          missing.append(target)
  for path in re.findall(r"`((?:csa_jax|environments|experiments|studies|benchmarks|tests|"
                         r"docs|reports)/[\w./-]*)`", text):
    if not re.search(r"[A-Z]{3}", path) and "*" not in path:  # NAME, RUN: placeholders
      if not os.path.exists(os.path.join(ROOT, path.split("::")[0].rstrip("/"))):
        missing.append(path)
  assert not missing, f"{doc} names what the repository does not have: {missing}"


def _lines(path: str) -> int:
  with open(os.path.join(ROOT, path)) as f:
    return sum(1 for _ in f)


def test_size_limits():
  assert _lines("README.md") <= 350, "the README leads; the rest belongs in docs/"
  studies = [f for f in os.listdir(os.path.join(ROOT, "studies")) if f.endswith(".py")]
  over = {f: _lines(os.path.join("studies", f)) for f in studies
          if _lines(os.path.join("studies", f)) > 650}
  assert not over, f"study tools over 650 lines: {over}"
