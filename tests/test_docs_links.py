"""README.md and docs/ name only what exists: links, modules, files, commands and make targets.

The package moved into floors (core/, selectors/, sim/, integrations/ ...) and the README's long
sections moved to docs/; a page that still says ``marconi.adaptive`` or links a section that left
sends a newcomer nowhere. Every relative link must reach a file (and its heading, if it names one),
every ``marconi.x.y`` name a module of src/ and a name defined there, every ``.py`` path a file,
every ``marconi ...`` command must parse with the real CLI, every ``make`` target be in the Makefile,
and every docs page be reachable from the README. Nothing here imports the modules it checks (the
engine's need torch): names are looked up in the source's syntax tree.
"""

from __future__ import annotations

import ast
import re
import shlex
import tomllib
from functools import cache
from pathlib import Path

import pytest

from marconi.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# names the restructuring retired: they must not come back into the docs
STALE = ("clone_cache", "snapshot_tree", "cache_from_snapshot", "cache.tuner")


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _ids(pages: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in pages]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(text: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_relative_link_reaches_a_file_and_heading(page: Path) -> None:
    broken = []
    for link in _links(_text(page)):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(link)
        elif anchor and target.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", _text(target), flags=re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(link)
    assert not broken, f"{page.name} links to what is not there: {broken}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(REPO / link.partition("#")[0]).resolve() for link in _links(_text(REPO / "README.md"))}
    orphans = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"


@cache
def _module_names(path: Path) -> dict[str, set[str]]:
    """Top-level names a module defines or imports, each class with its own body's names."""
    names: dict[str, set[str]] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    members.update(t.id for t in item.targets if isinstance(t, ast.Name))
            names[node.name] = members
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: set() for a in node.names})
        elif isinstance(node, ast.Assign):
            names.update({t.id: set() for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
    return names


def _module_file(dotted: str) -> Path | None:
    base = SRC.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolves(dotted: str) -> bool:
    """``marconi.a.b.Name.attr``: the longest prefix that is a module, then a name it defines, then
    (at most) a member of that class."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(".".join(parts[:cut]))
        if module is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        names = _module_names(module)
        if rest[0] not in names:
            return False
        return len(rest) == 1 or (len(rest) == 2 and rest[1] in names[rest[0]])
    return False


def test_the_resolver_tells_a_retired_module_from_a_live_one() -> None:
    assert _resolves("marconi.core.cache.PrefixCache.clone") and _resolves("marconi.workloads.build_workload")
    assert _resolves("marconi.choosers.bootstrap") and _resolves("marconi.sim.simulate")
    assert not _resolves("marconi.adaptive") and not _resolves("marconi.tuning")
    assert not _resolves("marconi.core.cache.clone_cache") and not _resolves("marconi.core.cache.PrefixCache.tuner")


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_module_path_the_page_names_exists(page: Path) -> None:
    names = set(re.findall(r"(?<![\w./-])marconi(?:\.[A-Za-z_]\w*)+", _text(page)))
    groups = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"])
    missing = sorted(n for n in names if not _resolves(n) and n not in groups)   # a registry's entry points
    assert not missing, f"{page.name} names modules or attributes that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_no_retired_name_is_left(page: Path) -> None:
    text = _text(page)
    left = [name for name in STALE if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text)]
    assert not left, f"{page.name} still names what the restructuring retired: {left}"


@cache
def _file_names() -> frozenset[str]:
    roots = [SRC, REPO / "benchmarks", REPO / "tests", REPO / "scripts"]
    top = {p.name for p in REPO.glob("*.py")}      # setup.py and its like, at the repository's root
    return frozenset(top | {p.name for root in roots for p in root.rglob("*.py")})


#: Path prefixes of the engines' own source trees, which the pages cite and this repository does not hold.
ENGINE_SOURCES = ("vllm/", "sglang/", "srt/")


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_python_file_the_page_names_exists(page: Path) -> None:
    missing = []
    for path in set(re.findall(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b", _text(page))):
        if path.startswith(ENGINE_SOURCES):         # a file of vLLM's or SGLang's own source tree
            continue
        if "/" in path:
            if not ((REPO / path).is_file() or (SRC / "marconi" / path).is_file()):
                missing.append(path)
        elif path not in _file_names():
            missing.append(path)
    assert not missing, f"{page.name} names Python files that do not exist: {sorted(missing)}"


PLACEHOLDERS = {"NAME": "swe-sample", "FILE": "out.jsonl"}


def _commands(text: str) -> list[str]:
    """Complete ``marconi`` commands (with options; elided ones, ``...``, are prose): inline ones,
    and the lines of bash blocks, continuation lines joined, comments dropped."""
    found = [s for s in re.findall(r"`(marconi [^`]+)`", text)]
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            match = re.match(r"(?:\.venv/bin/)?(marconi .*)", line)
            if match:
                found.append(match.group(1))
    commands = []
    for snippet in found:
        if "..." in snippet or " --" not in snippet.replace("\n", " "):
            continue
        commands.append(" ".join(PLACEHOLDERS.get(word, word) for word in snippet.split()))
    return commands


DOC_COMMANDS = sorted({(p.name, c) for p in PAGES for c in _commands(_text(p))})


def test_the_command_finder_sees_the_readme_commands() -> None:
    assert any(c.startswith("marconi simulate ") for page, c in DOC_COMMANDS if page == "README.md")


@pytest.mark.parametrize("page, command", DOC_COMMANDS)
def test_every_command_the_docs_show_parses(page: str, command: str) -> None:
    try:
        build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit as exc:          # argparse's way of saying the command is wrong
        pytest.fail(f"{page}: command no longer parses ({exc}): {command}")


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_make_target_the_page_names_exists(page: Path) -> None:
    targets = set(re.findall(r"^([\w-]+):", _text(REPO / "Makefile"), flags=re.M))
    text = _text(page)
    named = set(re.findall(r"`make ([a-z][\w-]*)", text))       # `make demo` in prose
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        named.update(re.findall(r"^make ([a-z][\w-]*)", block, flags=re.M))
    assert named <= targets, f"{page.name} names make targets the Makefile lacks: {sorted(named - targets)}"
