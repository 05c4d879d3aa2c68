"""The data page (``docs/data.md``, linked from the README's "Data" section) is instructions a user
follows by hand: they must stay true.

Every full data set has a source and a licence; every ``marconi ...`` command the page shows
parses with the real CLI (a renamed option or builder fails here, not in a user's shell); and every
folder of the documented ``$MARCONI_SHARED_DATA`` layout is one the package actually looks in. The
README keeps a short "Data" section pointing at the page: the package's own messages send users to
"the README's Data section".
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from marconi.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
DATA = (REPO / "docs" / "data.md").read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_the_readme_data_section_points_at_the_data_page() -> None:
    """``marconi.workloads.catalog`` and ``reproduce`` tell users to get data "as the README's Data
    section says": that section must exist and lead to the page with the instructions."""
    section = _section(README, "Data")
    assert "(docs/data.md)" in section and "$MARCONI_SHARED_DATA" in section


TABLE = [line for line in DATA.splitlines() if line.startswith("| ") and not line.startswith("| data |")]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def test_every_full_data_set_says_where_to_get_it_and_its_licence() -> None:
    rows = [_cells(line) for line in TABLE]
    assert len(rows) >= 7, "the table of full data sets went missing from docs/data.md"
    for data, where, licence, build in rows:
        assert data and where and licence and build, f"incomplete row for {data!r}"
        assert re.search(r"GitHub|Hugging Face", where), f"{data}: no source named"


PLACEHOLDERS = {"NAME": "swe-sample", "FILE": "out.jsonl"}


def _commands() -> list[str]:
    """The section's complete ``marconi`` commands (with options; mentions of a bare command name and
    elided ones, ``...``, are prose), placeholders filled in."""
    commands = []
    for snippet in re.findall(r"`(marconi [^`]+)`", DATA):
        if "..." in snippet or " --" not in snippet.replace("\n", " "):
            continue
        commands.append(" ".join(PLACEHOLDERS.get(word, word) for word in snippet.split()))
    return commands


@pytest.mark.parametrize("command", _commands())
def test_the_commands_the_data_section_shows_parse(command: str) -> None:
    argv = shlex.split(command)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:          # argparse's way of saying the command is wrong
        pytest.fail(f"docs/data.md command no longer parses ({exc}): {command}")


def test_the_data_section_shows_a_build_command_per_builder() -> None:
    builders = {shlex.split(c)[3] for c in _commands() if c.startswith("marconi trace build ")}
    assert {"swe", "sharegpt", "lmsys", "mooncake", "quality"} <= builders


def test_the_documented_layout_is_where_the_package_looks() -> None:
    block = DATA[DATA.index("$MARCONI_SHARED_DATA/\n"):]
    block = block[:block.index("```")]
    source = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "src" / "marconi").rglob("*.py"))
    entries = [line.split()[0] for line in block.splitlines()[1:] if line.strip()]
    assert len(entries) >= 6
    for entry in entries:
        parts = [p for p in entry.split("/") if p and "*" not in p]
        # every named folder or file of the layout appears in the code that looks for it
        for part in parts:
            assert part in source, f"docs/data.md's layout names {part!r} ({entry}); no code looks for it"


def test_the_options_the_table_adds_to_builders_exist() -> None:
    """Options the table names in prose: ``--shared-prefix`` on ``trace build swe``, ``--tokenizer``
    on the builders it lists."""
    assert "add `--shared-prefix FILE.traj` to `trace build swe`" in DATA
    build_parser().parse_args(["trace", "build", "swe", "trajs/", "--shared-prefix", "demo.traj", "--out", "o.jsonl"])
    listed = re.search(r"on `trace build ([a-z /]+)`", DATA)
    assert listed is not None, "the tokenizer row no longer lists its builders"
    builders = [b.strip() for b in listed.group(1).split("/")]
    assert builders == ["sharegpt", "lmsys", "swe", "quality"]
    for builder in builders:
        build_parser().parse_args(["trace", "build", builder, "in.json", "--tokenizer", "tok.json", "--out", "o.jsonl"])
