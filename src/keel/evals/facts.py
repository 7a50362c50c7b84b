"""Facts about a repository, read from its code at evaluation time, and answers checked by text.

The `repo-questions` suite asks a model about the repository it runs in (which modules a file
imports, a function's parameters, where a constant is defined...). The expected answer is
never written into the scenario: it is parsed from the code (`ast`) when the evaluation runs,
so the suite stays true as the code changes. `RepoFact.expected` gives what an answer must
name (each item with the spellings accepted for it); `invented` names what an answer claims
that the repository does not hold (a file path that does not exist, a module of the package
that the file does not import).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from keel.errors import ConfigError
from keel.evals import code_facts

__all__ = ["Expected", "FactKind", "RepoFact", "invented", "missing"]

FactKind = Literal[
    "imports",
    "parameters",
    "defined_in",
    "exports",
    "default",
    # issue 39 (keel.evals.code_facts)
    "raises",
    "prints",
    "tested_by",
    "methods",
    "subclasses",
    "compared_in",
    "parameter_default",
]
_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.py)\b")
_DOTTED = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")
_SKIP_DIRS = frozenset({".git", ".venv", "node_modules", "__pycache__", "build", "dist"})


@dataclass(frozen=True, slots=True)
class Expected:
    """What an answer must name (`required`: a label and the spellings accepted for it) and
    what it may name besides (`allowed_modules`, for the check of invented modules)."""

    required: tuple[tuple[str, tuple[str, ...]], ...]
    package: str | None = None
    """The package whose module names the answer must not invent (imports only)."""
    allowed_modules: frozenset[str] = frozenset()


class RepoFact(BaseModel):
    """A fact a repo question asks for, as the scenario's ``[fact]`` table writes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FactKind
    path: str | None = Field(default=None, min_length=1)
    """The module the fact is about (relative to the repository); for "defined_in", the folder
    searched for the definition (default: the whole repository)."""
    name: str | None = None
    """The function ("parameters", "raises", "prints", "parameter_default"; "Class.method" for
    a method), the constant ("defined_in"), "Class.field" ("default"), the name a test or a
    comparison mentions ("tested_by", "compared_in"), the class ("methods") or the base class
    ("subclasses")."""
    item: str | None = None
    """The parameter ("parameter_default") or the word in a method's name ("methods")."""

    def expected(self, repo: Path) -> Expected:
        """Read the fact from the repository now; a ConfigError says what could not be found."""
        if self.kind == "defined_in":
            return _defined_in(repo, self.path or ".", self._name())
        if self.kind == "tested_by":
            return Expected(code_facts.tested_by(repo, self._name()))
        if self.kind == "compared_in":
            return Expected(code_facts.compared_in(repo, self.path or ".", self._name()))
        tree = _parse(repo, self._path())
        if self.kind in ("raises", "prints", "subclasses"):
            reader = getattr(code_facts, self.kind)
            return Expected(reader(tree, self._path(), self._name()))
        if self.kind == "methods":
            return Expected(code_facts.methods(tree, self._path(), self._name(), self._item()))
        if self.kind == "parameter_default":
            found = code_facts.parameter_default(tree, self._path(), self._name(), self._item())
            return Expected(found)
        if self.kind == "imports":
            return _imports(tree, self._path())
        if self.kind == "parameters":
            return _parameters(tree, self._path(), self._name())
        if self.kind == "exports":
            return _exports(tree, self._path())
        return _default(tree, self._path(), self._name())

    def _path(self) -> str:
        if self.path is None:
            raise ConfigError(f"a {self.kind!r} fact needs the module's path")
        return self.path

    def _name(self) -> str:
        if not self.name:
            raise ConfigError(f"a {self.kind!r} fact needs a name")
        return self.name

    def _item(self) -> str:
        if not self.item:
            raise ConfigError(f"a {self.kind!r} fact needs an item")
        return self.item


def missing(expected: Expected, answer: str) -> list[str]:
    """Labels of the required items the answer names in none of their spellings."""
    text = answer.casefold()
    return [
        label
        for label, spellings in expected.required
        if not any(_names(text, s.casefold()) for s in spellings)
    ]


def invented(expected: Expected, answer: str, repo: Path) -> list[str]:
    """What the answer names that is not there: file paths the repository does not hold, and
    (for an imports question) modules of the package that the file does not import."""
    files = _repo_files(repo)
    wrong = [p for p in dict.fromkeys(_PATH.findall(answer)) if not _is_file(p, files)]
    if expected.package is not None:
        for dotted in dict.fromkeys(_DOTTED.findall(answer)):
            if dotted.endswith(".py") or dotted.split(".")[0] != expected.package:
                continue
            if not any(_related(dotted, m) for m in expected.allowed_modules):
                wrong.append(dotted)
    return wrong


# --- reading facts --------------------------------------------------------------------------


def _parse(repo: Path, rel: str) -> ast.Module:
    path = repo / rel
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        raise ConfigError(
            f"the repository {repo} has no readable Python module {rel} ({exc}); run the "
            "repo-questions suite in Keel's own repository, or point --repo at it"
        ) from None


def _module_spellings(module: str) -> tuple[str, ...]:
    """`keel._run.batch` also as `keel/_run/batch.py` (and `src/...`, and without `.py`)."""
    slashed = module.replace(".", "/")
    return (module, slashed, f"{slashed}.py")


def _imports(tree: ast.Module, rel: str) -> Expected:
    package = _package_of(rel)
    modules: list[str] = []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            module = _absolute(node, rel)
            modules.append(module)
            names += [f"{module}.{alias.name}" for alias in node.names]
    first_party = package.split(".")[0] if package else None
    required = tuple(
        (m, _module_spellings(m))
        for m in dict.fromkeys(modules)
        if first_party is not None and m.split(".")[0] == first_party
    )
    return Expected(required, first_party, frozenset([*modules, *names, package or ""]))


def _package_of(rel: str) -> str:
    """The dotted package a module file belongs to: src/keel/_run/loop.py -> keel._run."""
    parts = list(PurePosixPath(rel).with_suffix("").parts)
    if parts and parts[0] == "src":
        parts = parts[1:]
    return ".".join(parts[:-1])


def _absolute(node: ast.ImportFrom, rel: str) -> str:
    if node.level == 0:
        return node.module or ""
    base = _package_of(rel).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _parameters(tree: ast.Module, rel: str, name: str) -> Expected:
    args = code_facts.function_node(tree, rel, name).args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    names = [a.arg for a in every if a.arg not in ("self", "cls")]
    return Expected(tuple((n, (n,)) for n in names))


def _exports(tree: ast.Module, rel: str) -> Expected:
    for node in tree.body:
        value = _assigned(node, "__all__")
        if value is not None:
            return Expected(tuple((str(n), (str(n),)) for n in ast.literal_eval(value)))
    raise ConfigError(f"{rel} has no __all__")


def _default(tree: ast.Module, rel: str, name: str) -> Expected:
    owner, _, field = name.partition(".")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == owner:
            for item in node.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and item.target.id == field
                    and item.value is not None
                ):
                    value = ast.literal_eval(_field_default(item.value))
                    shown: tuple[str, ...] = (repr(value), str(value))
                    if isinstance(value, float) and value.is_integer():
                        shown += (str(int(value)),)  # 600.0 also as 600
                    return Expected(((f"{field} = {value!r}", shown),))
    raise ConfigError(f"{rel} has no class field {name} with a default")


def _field_default(value: ast.expr) -> ast.expr:
    """A dataclass field's default as written: ``= 5``, or ``= field(default=5, ...)``."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
        for keyword in value.keywords:
            if keyword.arg == "default":
                return keyword.value
    return value


def _defined_in(repo: Path, under: str, name: str) -> Expected:
    for rel in sorted(_repo_files(repo)):
        if not rel.endswith(".py") or not (under == "." or rel.startswith(under.rstrip("/") + "/")):
            continue
        try:
            tree = ast.parse((repo / rel).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError):
            continue
        for node in tree.body:
            value = _assigned(node, name)
            if value is not None:
                where = (rel, (rel, rel.removeprefix("src/")))
                try:
                    literal = ast.literal_eval(value)
                except ValueError:
                    return Expected((where,))
                shown: tuple[str, ...] = (repr(literal), str(literal))
                if isinstance(literal, int):
                    shown += (f"{literal:_}", f"{literal:,}")
                return Expected((where, (f"{name} = {literal!r}", shown)))
    raise ConfigError(f"no module under {under} in {repo} defines {name}")


def _assigned(node: ast.stmt, name: str) -> ast.expr | None:
    if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for t in node.targets
    ):
        return node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.value if node.target.id == name else None
    return None


# --- matching -------------------------------------------------------------------------------


def _names(text: str, spelling: str) -> bool:
    """`spelling` occurs in `text` as a whole name (not inside a longer identifier)."""
    pattern = rf"(?<![\w]){re.escape(spelling)}(?![\w])"
    return re.search(pattern, text) is not None


def _repo_files(repo: Path) -> set[str]:
    found: set[str] = set()
    for path in repo.rglob("*.py"):
        parts = path.relative_to(repo).parts
        if not any(p in _SKIP_DIRS for p in parts):
            found.add("/".join(parts))
    return found


def _is_file(named: str, files: set[str]) -> bool:
    """A path an answer names exists when some file of the repository ends with it."""
    named = named.lstrip("./")
    return any(f == named or f.endswith("/" + named) for f in files)


def _related(dotted: str, module: str) -> bool:
    """A dotted name is no invention when it is an imported module, inside one (a name it
    exports), or a package holding one."""
    return bool(module) and (
        dotted == module or dotted.startswith(module + ".") or module.startswith(dotted + ".")
    )
