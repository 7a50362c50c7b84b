"""More shapes of repository fact, read from the code with `ast` when the evaluation runs
(issue 39: the `repo-questions-20` suite). Each returns what an answer must name, each item a
label and the spellings accepted for it, which `keel.evals.facts.RepoFact.expected` makes an
`Expected`, as it does for its own five shapes:

- "raises": the exception classes a function raises itself (``raise X(...)``, ``raise X``)
  — every one must be named;
- "prints": what a command prints: for each ``typer.echo`` / ``print`` / ``console.print`` /
  ``.line`` call in a function, the longest constant piece of its text (four characters or
  more) — every one must be named;
- "tested_by": the test files (``tests/test_*.py``) that mention a name — any one of them is
  enough;
- "methods": a class's methods whose name contains a word — every one must be named;
- "subclasses": the classes of a module that subclass a class — every one must be named;
- "compared_in": the modules under a folder that compare a name (``x.name > 0``,
  ``name >= limit``) — any one of them is enough;
- "parameter_default": the default of one parameter of a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

from keel.errors import ConfigError

__all__ = [
    "Required",
    "compared_in",
    "function_node",
    "methods",
    "parameter_default",
    "prints",
    "raises",
    "subclasses",
    "tested_by",
]

Required = tuple[tuple[str, tuple[str, ...]], ...]
"""What an answer must name: (label, spellings accepted) for each item."""
_SKIP_DIRS = frozenset({".git", ".venv", "node_modules", "__pycache__", "build", "dist"})
_PRINTERS = frozenset({"echo", "print", "line", "secho"})


def _where(rel: str) -> tuple[str, ...]:
    return (rel, rel.removeprefix("src/"))


def function_node(
    tree: ast.Module, rel: str, name: str
) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The function `name` (or `Class.method`) defined at the top of `rel`'s module."""
    owner, _, func = name.rpartition(".")
    body: list[ast.stmt] = tree.body
    if owner:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        body = cls.body if cls is not None else []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == func:
            return node
    raise ConfigError(f"{rel} defines no function {name}")


def raises(tree: ast.Module, rel: str, name: str) -> Required:
    found: list[str] = []
    for node in ast.walk(function_node(tree, rel, name)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            label = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
            if label:
                found.append(label)
    if not found:
        raise ConfigError(f"{name} in {rel} raises nothing itself")
    return tuple((n, (n,)) for n in dict.fromkeys(found))


def _constant_pieces(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [
            v.value
            for v in node.values
            if isinstance(v, ast.Constant) and isinstance(v.value, str)
        ]
    return []


def prints(tree: ast.Module, rel: str, name: str) -> Required:
    required: list[str] = []
    for node in ast.walk(function_node(tree, rel, name)):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        called = node.func
        label = called.id if isinstance(called, ast.Name) else getattr(called, "attr", "")
        if label not in _PRINTERS:
            continue
        pieces = [p.strip().strip(":;,.()").strip() for p in _constant_pieces(node.args[0])]
        longest = max(pieces, key=len, default="")
        if len(longest) >= 4:
            required.append(longest)
    if not required:
        raise ConfigError(f"{name} in {rel} prints no constant text")
    return tuple((p, (p,)) for p in dict.fromkeys(required))


def tested_by(repo: Path, name: str) -> Required:
    files = sorted(
        "/".join(p.relative_to(repo).parts)
        for p in (repo / "tests").rglob("test_*.py")
        if not any(part in _SKIP_DIRS for part in p.relative_to(repo).parts)
        and name in p.read_text(encoding="utf-8", errors="replace")
    )
    if not files:
        raise ConfigError(f"no test file in {repo / 'tests'} mentions {name}")
    spellings = tuple(s for f in files for s in (f, f.removeprefix("tests/")))
    return ((f"a test file mentioning {name}", spellings),)


def methods(tree: ast.Module, rel: str, owner: str, word: str) -> Required:
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner), None)
    if cls is None:
        raise ConfigError(f"{rel} defines no class {owner}")
    names = [
        n.name
        for n in cls.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and word in n.name
    ]
    if not names:
        raise ConfigError(f"{owner} in {rel} has no method whose name contains {word!r}")
    return tuple((n, (n,)) for n in names)


def subclasses(tree: ast.Module, rel: str, base: str) -> Required:
    names = [
        n.name
        for n in tree.body
        if isinstance(n, ast.ClassDef)
        and any(getattr(b, "id", getattr(b, "attr", None)) == base for b in n.bases)
    ]
    if not names:
        raise ConfigError(f"{rel} has no subclass of {base}")
    return tuple((n, (n,)) for n in names)


def _compares(tree: ast.Module, name: str) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for part in (node.left, *node.comparators):
                for inner in ast.walk(part):
                    if getattr(inner, "attr", None) == name or getattr(inner, "id", None) == name:
                        return True
    return False


def compared_in(repo: Path, under: str, name: str) -> Required:
    found: list[str] = []
    for path in sorted((repo / under).rglob("*.py")):
        parts = path.relative_to(repo).parts
        if any(p in _SKIP_DIRS for p in parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError):
            continue
        if _compares(tree, name):
            found.append("/".join(parts))
    if not found:
        raise ConfigError(f"no module under {under} in {repo} compares {name}")
    spellings = tuple(s for f in found for s in _where(f))
    return ((f"a module comparing {name}", spellings),)


def parameter_default(tree: ast.Module, rel: str, name: str, parameter: str) -> Required:
    args = function_node(tree, rel, name).args
    positional = [*args.posonlyargs, *args.args]
    defaulted = positional[len(positional) - len(args.defaults) :]
    pairs: list[tuple[ast.arg, ast.expr | None]] = list(zip(defaulted, args.defaults, strict=True))
    pairs += list(zip(args.kwonlyargs, args.kw_defaults, strict=True))
    for arg, default in pairs:
        if arg.arg == parameter and default is not None:
            try:
                value = ast.literal_eval(default)
            except ValueError:
                shown: tuple[str, ...] = (ast.unparse(default),)
            else:
                shown = (repr(value), str(value))
                if isinstance(value, int) and not isinstance(value, bool):
                    shown += (f"{value:_}", f"{value:,}")
            return ((f"{parameter} = {shown[0]}", shown),)
    raise ConfigError(f"{name} in {rel} has no parameter {parameter} with a default")
