"""The floors stay visible: no import cycle, a numpy-only core, no reads of another's private state.

These walk the source (``ast``), so they see every import — module-level and inside functions,
``importlib.import_module``/``__import__`` of literal module names included — not just what one
test run happens to execute. Imports under ``if TYPE_CHECKING:`` are for type checkers only and do
not run, so they are left out. A registry's entry points (``pyproject.toml``) are plugin
discovery, not imports: that is how a lower floor learns of an upper one without naming it.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "marconi"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _literal_strings(node: ast.AST | None) -> set[str]:
    """Every string constant inside a literal (a string, tuple, list, set or dict of them, nested)."""
    if isinstance(node, ast.Constant):
        return {node.value} if isinstance(node.value, str) else set()
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*map(_literal_strings, node.elts))
    if isinstance(node, ast.Dict):
        return set().union(*map(_literal_strings, [*node.keys, *node.values]))
    return set()


def _bound_strings(tree: ast.AST) -> dict[str, set[str]]:
    """Name -> the strings it may hold: names assigned a literal, and loop variables over a literal
    or over such a name (``for module in ("a.b", "a.c")``, ``for module, where in _TABLE``). The
    file is one scope: a name takes the strings of every binding of it."""
    bound: dict[str, set[str]] = {}
    for _ in range(2):  # twice: a loop may come before the assignment of what it iterates
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets, value = (node.targets if isinstance(node, ast.Assign) else [node.target]), node.value
            elif isinstance(node, (ast.For, ast.comprehension)):
                targets, value = [node.target], node.iter
            else:
                continue
            strings = _literal_strings(value) | (bound.get(value.id, set()) if isinstance(value, ast.Name) else set())
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name) and strings:
                        bound.setdefault(name.id, set()).update(strings)
    return bound


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _imports_of(source: str, name: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import in ``source`` (module ``name``) that runs, absolute:
    ``import``/``from`` statements (relative ones resolved), ``importlib.import_module(...)`` and
    ``__import__(...)`` whose module is a string literal or a name bound only to literals (a loop
    over a tuple of module names), and ``Registry(..., providers=(...))`` module strings."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    tree = ast.parse(source)
    bound = _bound_strings(tree)
    found: list[tuple[int, str]] = []

    def strings(node: ast.AST) -> set[str]:
        return bound.get(node.id, set()) if isinstance(node, ast.Name) else _literal_strings(node)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            for alias in node.names:  # ``from pkg import submodule`` imports the submodule
                if f"{module}.{alias.name}" in MODULES:
                    found.append((node.lineno, f"{module}.{alias.name}"))
        elif isinstance(node, ast.Call) and _called(node) in ("import_module", "__import__") and node.args:
            fromlist = next((k.value for k in node.keywords if k.arg == "fromlist"),
                            node.args[3] if len(node.args) > 3 else None)
            for module in strings(node.args[0]):
                found.append((node.lineno, module))
                found.extend((node.lineno, f"{module}.{item}") for item in strings(fromlist)
                             if f"{module}.{item}" in MODULES)
        elif isinstance(node, ast.Call) and _called(node) == "Registry":
            for keyword in node.keywords:
                if keyword.arg == "providers":
                    found.extend((node.lineno, module) for module in strings(keyword.value))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _imports(path: Path) -> list[tuple[int, str]]:
    return _imports_of(path.read_text(), _module_name(path), path.name == "__init__.py")


def _edges_of(imports: dict[str, list[str]], known: set[str]) -> dict[str, set[str]]:
    """Module -> modules of ``known`` it imports. Importing ``a.b.c`` also runs the packages ``a.b``
    (their ``__init__``), except the importer's own ancestors and the top package, which Python has
    always finished or is finishing first."""
    edges: dict[str, set[str]] = {}
    for name, targets in imports.items():
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        out: set[str] = set()
        for target in targets:
            parts = target.split(".")
            for i in range(2, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in known and prefix != name and prefix not in ancestors:
                    out.add(prefix)
        edges[name] = out
    return edges


def _edges() -> dict[str, set[str]]:
    """Module -> project modules it imports, statically and through literal dynamic imports."""
    return _edges_of({name: [t for _, t in _imports(path)] for name, path in MODULES.items()}, set(MODULES))


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The checker itself can fail: a hand-made circle is reported, a chain is not."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_in_the_package() -> None:
    edges = _edges()
    assert len(edges) > 50 and edges["marconi.choosers.worlds"] >= {"marconi.core.cache"}
    assert _cycles(edges) == [], "import cycles (function-level imports count too)"


def test_the_import_finder_sees_dynamic_imports() -> None:
    """``importlib.import_module``/``__import__`` of a literal, or of a name that loops over literal
    module names, are edges like ``import`` statements, and a circle closed by one is found."""
    source_a = """
import importlib
from typing import TYPE_CHECKING

_TABLE = (("marconi.fake.d", "top"),)

def load(kind):
    importlib.import_module("marconi.fake.b")
    for module in ("marconi.fake.c",):
        __import__(module, fromlist=["register"])
    for module_name, where in _TABLE:
        importlib.import_module(module_name)
    importlib.import_module(f"marconi.fake.{kind}")        # not a literal: not followed
    PLUGINS = Registry("thing", providers=("marconi.fake.e",))

if TYPE_CHECKING:
    importlib.import_module("marconi.fake.z")
"""
    found = {target for _, target in _imports_of(source_a, "marconi.fake.a")}
    assert {"marconi.fake.b", "marconi.fake.c", "marconi.fake.d", "marconi.fake.e"} <= found
    assert "marconi.fake.z" not in found
    imports = {"marconi.fake.a": sorted(found), "marconi.fake.b": ["marconi.fake.a"]}
    assert _cycles(_edges_of(imports, set(imports))) == [["marconi.fake.a", "marconi.fake.b"]]


def _collapsed(edges: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The import graph inside ``package``, each of its subpackages one node (its modules' edges
    merged); its own modules stay nodes of their own, edges leaving ``package`` are dropped."""
    def node(module: str) -> str:
        sub = f"{package}.{module[len(package) + 1:].split('.')[0]}"
        return sub if module != package and MODULES[sub].name == "__init__.py" else module

    inside = [m for m in edges if m == package or m.startswith(package + ".")]
    out: dict[str, set[str]] = {node(m): set() for m in inside}
    for module in inside:
        out[node(module)] |= {node(t) for t in edges[module] if t in inside and node(t) != node(module)}
    return out


def test_no_cycle_among_the_vllm_integrations_subpackages() -> None:
    """``integrations/vllm/``'s subpackages (the emulation, the replay) stack: neither, taken whole,
    depends on a module that depends on it (what they share lives a floor below: layout, policy)."""
    collapsed = _collapsed(_edges(), "marconi.integrations.vllm")
    assert {"marconi.integrations.vllm.emulate", "marconi.integrations.vllm.replay"} <= set(collapsed)
    assert _cycles(collapsed) == []


# The plumbing floor directly above the core (docs/architecture.md); the core may point a user to it
# in a message (``marconi.units.parse_bytes``). Every other module outside the core is above it.
_PLUMBING = {"io", "units", "options", "pool", "report"}


def test_the_core_names_no_floor_above_it() -> None:
    """No text in ``core/`` — code, strings, docstrings, comments — names a module of an upper floor:
    the core states its contracts, and upper floors register through entry points."""
    upper = ({name.split(".")[1] for name in MODULES if name.count(".") >= 1} - {"core"} - _PLUMBING
             | {"selectors", "sparse", "sim", "integrations", "engine", "workloads", "lab", "experiments", "cli"})
    pattern = re.compile(r"\bmarconi\.(" + "|".join(sorted(upper)) + r")\b")
    offending = []
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offending.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert not offending, "the core names an upper floor:\n" + "\n".join(offending)


def test_no_module_imports_another_modules_private_names() -> None:
    """``from x import _name`` (or ``import x._name``) where ``x`` is another of our modules is refused,
    in the package and in the tests: what is shared is public. Dunder names are not private."""
    def private(part: str) -> bool:
        return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))

    offending = []
    for path in [*MODULES.values(), *sorted((SRC.parent / "tests").glob("*.py"))]:
        name = _module_name(path) if path.is_relative_to(SRC) else ""
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        rel = path.relative_to(SRC.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])
                                  ) if node.level else node.module or ""
                if module.split(".")[0] != "marconi" or module == name:
                    continue
                names = [alias.name for alias in node.names if private(alias.name)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.split(".")[0] == "marconi"
                         and any(map(private, alias.name.split(".")))]
            else:
                continue
            if names:
                offending.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not offending, "imports of another module's private names:\n" + "\n".join(offending)


def test_no_module_imports_the_command_line() -> None:
    """``marconi.cli`` assembles the commands; a command module (or any other) that imports it would
    make its own floor depend on the top one. What commands share lives below them."""
    offending = [f"{path.relative_to(SRC)}:{line}: {target}" for name, path in sorted(MODULES.items())
                 if name not in ("marconi.cli", "marconi.__main__") for line, target in _imports(path)
                 if target == "marconi.cli" or target.startswith("marconi.cli.")]
    assert not offending, "modules that import marconi.cli:\n" + "\n".join(offending)


def test_the_library_never_imports_the_lab() -> None:
    """The lab (``marconi.lab``: the studies and benches) imports the library, never the reverse:
    only the lab itself and ``marconi.cli``, which hands the lab the library's command groups, import
    it. The CLI's own import of the lab is seen, so the finder would see any other."""
    def lab(target: str) -> bool:
        return target == "marconi.lab" or target.startswith("marconi.lab.")

    assert any(lab(target) for _, target in _imports(MODULES["marconi.cli"]))
    offending = [f"{path.relative_to(SRC)}:{line}: {target}" for name, path in sorted(MODULES.items())
                 if not lab(name) and name not in ("marconi.cli", "marconi.__main__")
                 for line, target in _imports(path) if lab(target)]
    assert not offending, "library modules that import the lab:\n" + "\n".join(offending)


def test_the_core_imports_only_numpy_and_the_standard_library() -> None:
    allowed_roots = set(sys.stdlib_module_names) | {"numpy", "__future__"}
    offending = []
    for name, path in MODULES.items():
        if not name.startswith("marconi.core"):
            continue
        for line, target in _imports(path):
            inside = target == "marconi.core" or target.startswith("marconi.core.")
            if not inside and target.split(".")[0] not in allowed_roots:
                offending.append(f"{path.relative_to(SRC)}:{line}: {target}")
    assert not offending, "marconi.core must need numpy alone:\n" + "\n".join(offending)


# The vLLM plugin patches vLLM's own objects (its block pool and scheduler), whose hooks are
# private methods: that is what a general plugin is. Each access is listed here, so a new one is a
# decision, not an accident. Our own modules never read one another's private state.
_VLLM_PRIVATES = {"_insert_block_hash", "_remove_cached_block_hashes", "_maybe_evict_cached_block", "_free_request",
                  "_reuse_watchers", "_notify_reuse",
                  "_mamba_block_aligned_split"}    # sparse-dp retention's chunk stops (RetentionHooks)
_PLUGIN = "marconi/integrations/vllm/plugin.py"


def _private_names_defined(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                and node.attr.startswith("_")):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name.startswith("_"):
            names.add(node.name)
    return names


def test_no_module_reads_another_modules_private_state() -> None:
    """``x._name`` outside ``self``/``cls`` is allowed only where ``_name`` belongs to the same
    module (a class reading another instance of itself). Tests included: they use public seams."""
    defined = {path: _private_names_defined(path) for path in MODULES.values()}
    ours = set().union(*defined.values())
    offending = []
    for path in [*MODULES.values(), *sorted((SRC.parent / "tests").glob("*.py"))]:
        own = defined.get(path, set())
        rel = path.relative_to(SRC.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in own or node.attr not in ours:
                continue  # the module's own, or a name no module of ours defines (another library's)
            if rel.endswith(_PLUGIN) and node.attr in _VLLM_PRIVATES:
                continue
            offending.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not offending, "reads of another module's private state:\n" + "\n".join(offending)


_CORE_ONLY = """
import sys
import marconi
from marconi import PrefixCache
cache = PrefixCache("paper-7b", 5e9, "marconi", "worlds")
for tokens, output in (([1, 2, 3, 4], [5, 6]), ([1, 2, 3, 9], [7])):
    handle = cache.begin(tokens)
    cache.finish(handle, output)
cache.check_invariants()
assert cache.stats.num_requests == 2, cache.stats.num_requests
third = {m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names) - {"marconi", "numpy", "__main__"}
print(sorted(third))
"""


def test_the_cache_runs_with_numpy_alone(tmp_path: Path) -> None:
    """``from marconi import PrefixCache`` and begin/finish in an interpreter that can see only the
    standard library, numpy, ``src/`` and this package's installed metadata (its entry points: the
    registries' plugins) (isolated mode, no site-packages): what ``pip install marconi`` without
    extras gives an engine. The Makefile's ``check-core`` does the same in a real fresh virtual
    environment with numpy alone."""
    numpy_dir = Path(np.__file__).resolve().parent
    visible = tmp_path / "site"
    visible.mkdir()
    (visible / "numpy").symlink_to(numpy_dir)
    libs = numpy_dir.parent / "numpy.libs"       # manylinux wheels keep OpenBLAS beside the package
    if libs.is_dir():
        (visible / "numpy.libs").symlink_to(libs)
    metadata = [info for entry in map(Path, sys.path) if entry.is_dir() and entry.resolve() != SRC
                for info in entry.glob("marconi*-info") if (info / "entry_points.txt").is_file()]
    for info in metadata[:1]:       # an editable install's metadata may also lie in src/ (seen there)
        (visible / info.name).symlink_to(info.resolve())
    script = f"import sys; sys.path[:0] = [{str(SRC)!r}, {str(visible)!r}]\n" + _CORE_ONLY
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"the core imported third-party modules: {out.stdout}"


def test_a_command_missing_an_extra_names_the_extra(monkeypatch, capsys) -> None:
    """Where only the core is installed, a command that needs an extra says which, not a traceback."""
    import pytest

    import marconi.cli

    def needs_tqdm(args: object) -> int:
        raise ModuleNotFoundError("No module named 'tqdm'", name="tqdm")

    def needs_something_else(args: object) -> int:
        raise ModuleNotFoundError("No module named 'nowhere'", name="nowhere")

    monkeypatch.setattr(marconi.cli, "_cmd_models", needs_tqdm)
    assert marconi.cli.main(["models"]) == 2
    err = capsys.readouterr().err
    assert "needs tqdm" in err and "pip install 'marconi[sim]'" in err
    monkeypatch.setattr(marconi.cli, "_cmd_models", needs_something_else)
    with pytest.raises(ModuleNotFoundError):   # not an optional package of ours: a real bug, shown as one
        marconi.cli.main(["models"])
