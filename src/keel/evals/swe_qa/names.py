"""Code names in an answer, and an index of the names a repository holds, to check them by.

An answer "names" code in three ways (issue 51): a backticked identifier (`` `ensure_ascii` ``,
`` `Blueprint.register()` ``), a dotted name in the text (``flask.json.provider``), a file path
(``src/flask/app.py``). Prose words are not names: a score that counted them would reward
length. Fenced code blocks are left out: they quote code, they do not name it.

"Exists in the repository" is decided by `RepoIndex`, built from the code itself: every path
and folder, and every identifier: for Python files (`ast`) the module names their paths give,
def and class names, parameters, attributes, imported and assigned names; for any other text
file (docs, configuration) its identifier tokens. A dotted name exists when each of its parts
does; a path when a file or folder of the repository ends with it.
"""

from __future__ import annotations

import ast
import keyword
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

__all__ = ["CodeName", "RepoIndex", "code_names", "named_in", "reference_paths"]

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_TICKS = re.compile(r"`([^`\n]{1,200})`")
_EXTENSIONS = "py|pyi|rst|md|txt|toml|cfg|ini|yaml|yml|html|htm"
"""Endings that make a name without a folder a file name; `json`, `js`, `c` are not among
them: `Response.json` and `flask.json` are names. With a folder, any ending makes a path."""
_PATH = re.compile(
    rf"(?<![\w/.:-])((?:[\w.-]+/)+[\w.-]+\.\w+|[\w-]+(?:\.[\w-]+)*\.(?:{_EXTENSIONS}))(?![\w/])"
)
_WHOLE_PATH = re.compile(
    rf"^(?:[\w-]+(?:\.[\w-]+)*\.(?:{_EXTENSIONS})|(?:[\w.-]+/)+(?:[\w.-]+\.\w+)?)$"
)
_DOTTED = re.compile(r"(?<![\w./`-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w`(]|\.\w)")
_DOTTED_CALL = re.compile(r"(?<![\w./`-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?=\()")
_NAME = re.compile(r"^@?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(.*\))?[.,:;]?$")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NOT_NAMES = frozenset(
    {"e.g", "i.e", "etc", "vs", "True", "False", "None", "self", "cls"} | set(keyword.kwlist)
)
_SKIP_DIRS = frozenset({".git", "__pycache__", "node_modules", ".venv", ".tox"})
_MAX_FILE_BYTES = 2_000_000
_MAX_FILES = 20_000


@dataclass(frozen=True, slots=True)
class CodeName:
    """A name an answer gives: its text, and whether it is a path or a (dotted) identifier."""

    text: str
    kind: str
    """"path" or "name"."""


def _strip_owner(name: str) -> str:
    """`self.ensure_ascii` and `cls.x` name the attribute; the receiver is not a name."""
    parts = name.split(".")
    while len(parts) > 1 and parts[0] in ("self", "cls"):
        parts = parts[1:]
    return ".".join(parts)


def _span_name(span: str) -> CodeName | None:
    span = span.strip()
    if _WHOLE_PATH.match(span):
        return CodeName(span[2:] if span.startswith("./") else span, "path")
    match = _NAME.match(span)
    if match is None:
        return None
    name = _strip_owner(match.group(1))
    if name in _NOT_NAMES or len(name) < 2:
        return None
    return CodeName(name, "name")


def code_names(text: str) -> list[CodeName]:
    """The code names `text` gives, in order, each once."""
    text = _FENCE.sub(" ", text or "")
    found: list[CodeName] = []
    for span in _TICKS.findall(text):
        named = _span_name(span)
        if named is not None:
            found.append(named)
    rest = _TICKS.sub(" ", text)
    for path in _PATH.findall(rest):
        found.append(CodeName(path, "path"))
    rest = _PATH.sub(" ", rest)
    for pattern in (_DOTTED_CALL, _DOTTED):
        for dotted in pattern.findall(rest):
            name = _strip_owner(dotted)
            if (
                name not in _NOT_NAMES
                and "." in name
                and not name.lower().startswith(("e.g", "i.e"))
            ):
                found.append(CodeName(name, "name"))
    return list(dict.fromkeys(found))


def reference_paths(text: str) -> list[str]:
    """The file paths a (reference) answer cites, in order."""
    return [n.text for n in code_names(text) if n.kind == "path"]


def _word(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", text) is not None


def named_in(answer: str, name: CodeName, answer_paths: Iterable[str] = ()) -> bool:
    """Whether `answer` names `name`: a path by a path with the same file name that one of
    the two ends with; a dotted name whole, or each of its parts as a word of the answer (so
    "the `dumps` method of `DefaultJSONProvider`" names `DefaultJSONProvider.dumps`)."""
    if name.kind == "path":
        want = name.text.strip("/")
        for given in answer_paths:
            given = given.strip("/")
            same_file = PurePosixPath(given).name == PurePosixPath(want).name
            if same_file and (want.endswith(given) or given.endswith(want)):
                return True
        return False
    if _word(answer, name.text):
        return True
    return all(_word(answer, part) for part in name.text.split("."))


@dataclass(slots=True)
class RepoIndex:
    """The paths and identifiers of one repository, read from its files."""

    root: Path
    files: list[str] = field(default_factory=list)
    folders: set[str] = field(default_factory=set)
    identifiers: set[str] = field(default_factory=set)

    @classmethod
    def build(cls, root: Path) -> RepoIndex:
        index = cls(root.resolve())
        for rel in index._walk():
            index.files.append(rel)
            parts = PurePosixPath(rel).parts
            for n in range(1, len(parts)):
                index.folders.add("/".join(parts[:n]))
            index.identifiers.update(p.split(".")[0] for p in parts)
            index._read(rel)
        return index

    def _walk(self) -> Iterable[str]:
        count = 0
        for folder, dirs, names in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
            for name in sorted(names):
                path = Path(folder) / name
                if path.is_symlink() or not path.is_file():
                    continue
                count += 1
                if count > _MAX_FILES:
                    return
                yield path.relative_to(self.root).as_posix()

    def _read(self, rel: str) -> None:
        path = self.root / rel
        try:
            if path.stat().st_size > _MAX_FILE_BYTES:
                return
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return
        if rel.endswith(".py"):
            try:
                self.identifiers.update(_python_names(ast.parse(text)))
                return
            except (SyntaxError, ValueError, RecursionError):
                pass
        self.identifiers.update(_TOKEN.findall(text))

    def file_for(self, path: str) -> str | None:
        """The repository file `path` names (itself, or the one file ending with ``/path``)."""
        want = path.strip()
        want = (want[2:] if want.startswith("./") else want).strip("/")
        if want in self.files:
            return want
        ends = [f for f in self.files if f.endswith("/" + want)]
        return ends[0] if len(ends) == 1 else (min(ends, key=len) if ends else None)

    def exists(self, name: CodeName) -> bool:
        if name.kind == "path":
            want = name.text.strip("/")
            if self.file_for(want) is not None or want in self.folders:
                return True
            return any(f.endswith("/" + want) for f in self.folders)
        return all(part in self.identifiers for part in name.text.split("."))


def _python_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
            if node.asname:
                names.add(node.asname)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(node.module.split("."))
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
    return names
