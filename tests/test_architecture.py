"""The floors stay visible: no import cycle, a numpy-only core, no reads of another's private state.

These walk the source (``ast``), so they see every import — module-level and inside functions —
not just what one test run happens to execute. Imports under ``if TYPE_CHECKING:`` are for type
checkers only and do not run, so they are left out. Registry providers (a module named as a
string in ``Registry(..., providers=...)``) are plugin discovery, like entry points, not imports.
"""

from __future__ import annotations

import ast
import os
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


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import that runs, absolute, including relative ones."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: list[tuple[int, str]] = []

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
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _edges() -> dict[str, set[str]]:
    """Module -> project modules it imports. Importing ``a.b.c`` also runs the packages ``a.b``
    (their ``__init__``), except the importer's own ancestors and the top ``marconi`` package,
    which Python has always finished or is finishing first."""
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        out: set[str] = set()
        for _, target in _imports(path):
            parts = target.split(".")
            for i in range(2, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in MODULES and prefix != name and prefix not in ancestors:
                    out.add(prefix)
        edges[name] = out
    return edges


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
    assert len(edges) > 50 and edges["marconi.selectors.worlds"] >= {"marconi.core.cache"}
    assert _cycles(edges) == [], "import cycles (function-level imports count too)"


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
    standard library, numpy and ``src/`` (isolated mode, no site-packages): what ``pip install
    marconi`` without extras gives an engine. The Makefile's ``check-core`` does the same in a real
    fresh virtual environment with numpy alone."""
    numpy_dir = Path(np.__file__).resolve().parent
    visible = tmp_path / "site"
    visible.mkdir()
    (visible / "numpy").symlink_to(numpy_dir)
    libs = numpy_dir.parent / "numpy.libs"       # manylinux wheels keep OpenBLAS beside the package
    if libs.is_dir():
        (visible / "numpy.libs").symlink_to(libs)
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
