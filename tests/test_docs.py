"""The documents stay true: the layout table (`docs/layout.md`) names exactly the modules of
`src/keel`, every test an ADR names as its guard exists, every document the code, tests and docs
point at (an ADR by number, a `docs/` page) is in the repository, the drawing of the rooms in
`docs/design.md` names the rooms `tests/test_import_graph.py` declares, in their order (ADR
0058), and the README stays a short guide: under 260 lines, its first screen the two commands,
its map linking every `docs/` page (issue 31), every link of it and of the pages leading to a
file and a heading that exist."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from test_import_graph import ROOMS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "keel"
GUARD = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def layout_table() -> list[str]:
    """The first cell of every row of the table of `docs/layout.md`: one module each."""
    section = (ROOT / "docs" / "layout.md").read_text()
    rows = [line for line in section.splitlines() if line.startswith("|")]
    cells = [row.split("|")[1].strip() for row in rows[2:]]  # past the header and the rule
    return [cell.strip("`") for cell in cells]


def package_modules() -> set[str]:
    """Every module of the package, as the table names it: a package by its folder."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py" and relative.parent != Path("."):
            names.add(f"{relative.parent.as_posix()}/")
        else:
            names.add(relative.as_posix())
    return names


def test_the_readme_layout_table_lists_every_module_once() -> None:
    listed = layout_table()
    assert len(listed) == len(set(listed)), "a module is listed twice"
    modules = package_modules()
    assert {"not in the table": modules - set(listed), "no such module": set(listed) - modules} == {
        "not in the table": set(),
        "no such module": set(),
    }


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def adr_guards() -> list[tuple[str, str, str]]:
    return [
        (adr.name, file, name)
        for adr in sorted((ROOT / "docs" / "adr").glob("*.md"))
        for file, name in GUARD.findall(adr.read_text())
    ]


def test_every_test_an_adr_names_exists() -> None:
    guards = adr_guards()
    assert guards, "no ADR names a guarding test"
    missing = [
        f"{adr}: {file}::{name}"
        for adr, file, name in guards
        if not (ROOT / file).is_file() or name not in defined_tests(ROOT / file)
    ]
    assert missing == []


def test_every_adr_names_a_guarding_test() -> None:
    guarded = {adr for adr, _, _ in adr_guards()}
    adrs = {adr.name for adr in (ROOT / "docs" / "adr").glob("*.md")}
    assert adrs - guarded == set()


ADR_REFERENCE = re.compile(r"\bADR[- ](\d{3,4})\b")
DOC_REFERENCE = re.compile(r"\b((?:docs|shared|spec)/[\w./-]+\.(?:md|txt))\b|\b(SYSTEM\.md)\b")


def references(text: str) -> set[str]:
    """The documents a text points at: ADRs by number, pages by path."""
    found = {f"ADR {int(n):04d}" for n in ADR_REFERENCE.findall(text)}
    for path, system in DOC_REFERENCE.findall(text):
        found.add(path or system)
    return found


def test_the_reference_check_sees_what_a_reader_would_follow() -> None:
    text = 'see SYSTEM.md, ADR-0136, ADR 0002 and docs/design.md ("Where the code lives")'
    assert references(text) == {"SYSTEM.md", "ADR 0136", "ADR 0002", "docs/design.md"}


def prose(path: Path) -> str:
    """What a reader reads as text: a document whole; of Python, its comments and docstrings
    (a test's data may name files of a scratch repository that are not ours)."""
    text = path.read_text()
    if path.suffix != ".py":
        return text
    kept = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT or (
            token.type == tokenize.STRING and token.string.lstrip("rbuRBU").startswith('"""')
        ):
            kept.append(token.string)
    return "\n".join(kept)


def test_every_document_the_code_and_docs_point_at_is_in_the_repository() -> None:
    adrs = {f"ADR {path.name[:4]}" for path in (ROOT / "docs" / "adr").glob("*.md")}
    texts = [
        path
        for folder in ("src", "tests", "docs", "benchmarks", "examples")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".md", ".toml", ".json") and path.name != "test_docs.py"
    ]
    texts += [ROOT / "README.md", ROOT / "SECURITY.md", ROOT / "Makefile"]
    missing = sorted(
        f"{path.relative_to(ROOT)}: {ref}"
        for path in texts
        for ref in references(prose(path))
        if ref not in adrs and not (ref.startswith("docs/") and (ROOT / ref).is_file())
    )
    assert missing == []


README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def links(path: Path) -> list[str]:
    """The targets of a document's markdown links, outside its code blocks."""
    return LINK.findall(FENCE.sub("", path.read_text()))


def anchors(path: Path) -> set[str]:
    """The anchors a page's headings get where it is read (GitHub's rule: lower case, spaces
    to hyphens, punctuation but hyphens and underscores dropped)."""
    found = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_page_the_readme_links_exists() -> None:
    linked = [target.split("#")[0] for target in links(README) if "://" not in target]
    assert linked, "the README links no page"
    assert [target for target in linked if not (ROOT / target).exists()] == []


def test_every_docs_page_is_on_the_readme_map() -> None:
    mapped = {(ROOT / target.split("#")[0]).resolve() for target in links(README)}
    assert [page.name for page in PAGES if page.resolve() not in mapped] == []


def test_every_link_of_the_readme_and_the_pages_leads_to_a_file_and_a_heading() -> None:
    broken = []
    for path in [README, *PAGES]:
        for target in links(path):
            if "://" in target:
                continue
            file, _, anchor = target.partition("#")
            found = (path.parent / file).resolve() if file else path
            if not found.exists() or (anchor and anchor not in anchors(found)):
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []


def test_the_readme_stays_a_short_guide() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < 260
    first_screen = "\n".join(lines[:25])
    assert "make run" in first_screen and "make test" in first_screen


ROOM = re.compile(r"(\w+)(?:\.py|/)")


def drawn_rooms(text: str) -> list[str]:
    """The rooms the drawing under "Where the code lives" names, top first and left to right:
    the first indented block there, a module as `name.py`, a package as `name/`, the package's
    own `__init__.py` as `keel` (as `ROOMS` names it)."""
    section = text.split("## Where the code lives", 1)[1].splitlines()
    start = next(n for n, line in enumerate(section) if line.startswith("    "))
    block = []
    for line in section[start:]:
        if not line.startswith("    "):
            break
        block.append(line)
    names = ROOM.findall("\n".join(block))
    return ["keel" if name == "__init__" else name for name in names]


def test_the_drawing_of_the_rooms_names_the_declared_rooms_in_their_order() -> None:
    drawn = drawn_rooms((ROOT / "docs" / "design.md").read_text())
    assert drawn == list(reversed(ROOMS))


def test_the_drawing_check_reads_names_in_order_and_ignores_the_labels() -> None:
    drawing = "    the edges   cli/ · agent.py\n    ground      __init__.py\n"
    text = f"## Where the code lives\n\nRooms:\n\n{drawing}\n- `x.py`, below the drawing"
    assert drawn_rooms(text) == ["cli", "agent", "keel"]
