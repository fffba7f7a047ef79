"""The repository's layout: an import graph without circles, between modules and between
the library's rooms (its subpackages and the modules directly in csa_jax/), with no arrow
back up a layer; documentation whose links and named files exist; and the size limits of
the README, the study tools, the library's files and the trainer's methods."""

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


# The repository's packages, lowest first: each imports only those before it.
REPOSITORY_LAYERS = ("environments", "csa_jax", "experiments", "studies", "launch", "benchmarks")
# The library's rooms (a subpackage, or a module directly in csa_jax/), lowest first, in
# the order one iteration's data flows through them: a room imports only rooms of the
# layers before its own.
LIBRARY_LAYERS = (
    ("algo_config", "methods", "losses", "provenance", "workdir", "perf", "credit",
     "distributed"),
    ("estimators", "model"),
    ("config_fields",),
    ("config",),
    ("pretrained", "update"),
    ("rollout",),
    ("algorithms",),
    ("run",),
)
MAX_LIBRARY_MODULES = 12
MAX_LIBRARY_LINES = 500
MAX_TRAINER_METHOD_LINES = 60


def room(module: str) -> str:
  """The node of the package graph a module belongs to: inside csa_jax a subpackage or a
  module directly in it (csa_jax.run.trainer -> run), elsewhere its top-level package."""
  parts = module.split(".")
  if parts[0] != "csa_jax":
    return parts[0]
  return parts[1] if len(parts) > 1 else "__init__"


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  """The import graph with rooms as nodes (lazy, function-level imports included)."""
  out: dict[str, set[str]] = {}
  for mod, targets in graph.items():
    for t in targets:
      if room(mod) != room(t):
        out.setdefault(room(mod), set()).add(room(t))
  return out


def test_package_graph_finds_a_circle():
  graph = {"csa_jax.rollout.groups": {"csa_jax.update.data"},
           "csa_jax.update.data": {"csa_jax.rollout.metrics"}}
  assert cycles(package_graph(graph)) == [["rollout", "update"]]


def test_no_package_circles():
  """Subpackages as nodes: two modules of different rooms that import each other through
  other modules make a circle here even where the module graph has none."""
  assert cycles(package_graph(import_graph())) == []


def _arrows_back_up() -> list[str]:
  layer = {name: i for i, names in enumerate(LIBRARY_LAYERS) for name in names}
  repo = {name: i for i, name in enumerate(REPOSITORY_LAYERS)}
  out = []
  for mod, targets in import_graph().items():
    for t in targets:
      a, b = mod.split(".")[0], t.split(".")[0]
      if a != b and a in repo and b in repo and repo[b] > repo[a]:
        out.append(f"{mod} -> {t}")
      if a == b == "csa_jax" and room(mod) != room(t) and room(mod) != "__init__" and \
          layer.get(room(t), len(layer)) >= layer.get(room(mod), -1):
        out.append(f"{mod} -> {t}")
  return sorted(out)


def test_no_arrows_back_up():
  """The library imports nothing of the experiments, studies, launcher or benchmarks, and
  each of its rooms only rooms of lower layers (a new room must be given its layer)."""
  assert _arrows_back_up() == []
  rooms = {room(m) for m in import_graph() if m.startswith("csa_jax.")}
  layered = {name for names in LIBRARY_LAYERS for name in names}
  assert rooms - {"__init__"} == layered, "LIBRARY_LAYERS names every room of csa_jax/"


def test_library_layout():
  """A few rooms directly in csa_jax/, each subpackage saying what it owns, and no file
  longer than a reader holds at once."""
  lib = os.path.join(ROOT, "csa_jax")
  top = [f for f in os.listdir(lib) if f.endswith(".py")]
  assert len(top) <= MAX_LIBRARY_MODULES, f"{len(top)} modules directly in csa_jax/: {top}"
  for d in os.listdir(lib):
    init = os.path.join(lib, d, "__init__.py")
    if os.path.isdir(os.path.join(lib, d)) and d != "__pycache__":
      with open(init) as f:
        assert ast.get_docstring(ast.parse(f.read())), f"csa_jax/{d}/ says what it owns"
  long = {m: _lines(p) for m, p in _modules().items()
          if m.split(".")[0] == "csa_jax" and _lines(p) > MAX_LIBRARY_LINES}
  assert not long, f"csa_jax files over {MAX_LIBRARY_LINES} lines: {long}"


def test_trainer_methods_read_on_one_screen():
  path = os.path.join(ROOT, "csa_jax", "run", "trainer.py")
  with open(path) as f:
    tree = ast.parse(f.read())
  trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
  long = {n.name: n.end_lineno - n.lineno + 1 for n in trainer.body
          if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno + 1 >
          MAX_TRAINER_METHOD_LINES}
  assert not long, f"Trainer methods over {MAX_TRAINER_METHOD_LINES} lines: {long}"
