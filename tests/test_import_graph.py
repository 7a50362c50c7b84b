"""The shape of the package, read from the source with `ast`: no import circles (imports under
TYPE_CHECKING and inside functions included), and the layers point one way: the store never
imports the run core, the command line or the presenters; the run core never imports the
command line or the presenters (docs/design.md, "Where the code lives")."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:  # `from keel._run import batch` names a module
                    full = f"{base}.{alias.name}"
                    targets.append(full if full in modules else base)
            for target in targets:
                found = owner(target)
                if found is not None and found != name and found.startswith("keel"):
                    graph[name].add(found)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
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
                        circles.append(sorted(component))
    return circles


def test_no_import_circle_among_keel_modules() -> None:
    assert _circles(_graph()) == []


def test_the_circle_check_finds_a_circle() -> None:
    """The check can fail: a graph with a circle through three modules is reported."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


def _imports_of(prefix: str) -> dict[str, set[str]]:
    return {m: deps for m, deps in _graph().items() if m == prefix or m.startswith(prefix + ".")}


def test_the_store_never_imports_the_run_core_the_cli_or_the_presenters() -> None:
    forbidden = ("keel._run", "keel.cli", "keel.present")
    leaks = {
        module: sorted(d for d in deps if d.startswith(forbidden))
        for module, deps in _imports_of("keel.store").items()
    }
    assert {m: d for m, d in leaks.items() if d} == {}


def test_the_run_core_never_imports_the_cli_or_the_presenters() -> None:
    forbidden = ("keel.cli", "keel.present", "keel.ui", "keel.pool", "keel.evals")
    leaks = {
        module: sorted(d for d in deps if d.startswith(forbidden))
        for module, deps in _imports_of("keel._run").items()
    }
    assert {m: d for m, d in leaks.items() if d} == {}


def test_the_run_core_holds_no_model_of_its_own() -> None:
    """The run core is model-neutral (issue 31): the embedded model, its format, grammar and
    first-call steering (the question-word rules) live in `keel.transports.local`, which the
    run core never imports; it asks a transport through `SteersFirstCall` instead."""
    leaks = {
        module: sorted(d for d in deps if d.startswith("keel.transports.local"))
        for module, deps in _imports_of("keel._run").items()
    }
    assert {m: d for m, d in leaks.items() if d} == {}
    modules = _modules()
    assert "keel.transports.local.steering" in modules
    assert not [m for m in modules if m.startswith("keel._run.") and "first_call" in m]


def test_the_question_word_rules_live_only_with_the_local_model() -> None:
    """No module of the run core matches a question's words: none compiles a pattern."""
    found = {}
    for name, path in _modules().items():
        if name == "keel._run" or name.startswith("keel._run."):
            tree = ast.parse(path.read_text())
            calls = [
                node.lineno
                for node in ast.walk(tree)
                if isinstance(node, ast.Call)
                and ast.unparse(node.func) in ("re.compile", "re.search", "re.match", "re.findall")
            ]
            if calls:
                found[name] = calls
    assert found == {}


def test_observers_never_import_the_run_loop() -> None:
    """Traces and the event stream see records and a read-only view, not the loop's parts."""
    for observer in ("keel.telemetry", "keel.events", "keel.present.progress"):
        deps = _graph()[observer]
        assert not {d for d in deps if d.startswith("keel._run")}, (observer, deps)


ROOMS = (
    "_lazy", "_version", "errors", "canonical", "informative", "codec", "messages", "hosted",
    "limits", "result", "records", "ledger", "tokens", "trace_hooks", "trace_export", "failpoints",
    "config", "durability", "setting_checks", "schema_checks", "structured", "citations",
    "transports", "inbound", "pricing", "windows", "tools", "store", "approvals", "hooks",
    "live_file", "telemetry", "_run", "events", "subagents", "models", "agent", "present",
    "replay", "run_options", "assemble", "evals", "pool", "ui", "serve", "cli", "__main__", "keel",
)  # fmt: skip
"""The package's rooms (top-level modules and packages), lowest first: a room imports only rooms
below it, so no lower room reaches up (the event stream into the presenters, the workers into
the command line)."""


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "keel"


def _upward(graph: dict[str, set[str]], rooms: tuple[str, ...]) -> list[str]:
    rank = {room: n for n, room in enumerate(rooms)}
    found = []
    for module, deps in sorted(graph.items()):
        for dep in sorted(deps):
            here, there = _room(module), _room(dep)
            if here == there:
                continue
            if here not in rank or there not in rank:
                found.append(f"{module} -> {dep}: a room not in ROOMS")
            elif rank[there] > rank[here]:
                found.append(f"{module} -> {dep}")
    return found


def test_every_room_imports_only_rooms_below_it() -> None:
    assert _upward(_graph(), ROOMS) == []


def test_the_room_check_finds_an_upward_import() -> None:
    """The arrows issue 31 removed would be reported: the workers importing the command line,
    and the event stream importing a presenter."""
    graph = {
        "keel.pool.worker": {"keel.cli.agent"},
        "keel.events": {"keel.present.timeline"},
        "keel.cli.app": {"keel.pool.worker"},
    }
    assert _upward(graph, ROOMS) == [
        "keel.events -> keel.present.timeline",
        "keel.pool.worker -> keel.cli.agent",
    ]


def _through_a_side_door(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a run-core module from outside the run core (not its package face)."""
    return [
        f"{module} -> {dep}"
        for module, deps in sorted(graph.items())
        if module != "keel._run" and not module.startswith("keel._run.")
        for dep in sorted(deps)
        if dep.startswith("keel._run.")
    ]


def test_outside_the_run_core_modules_import_it_through_its_package_face_only() -> None:
    """As trio keeps `_core`: `from keel._run import RunLoop`, never `keel._run.loop`, so the
    run core's modules can move without an edit outside it (issue 43)."""
    assert _through_a_side_door(_graph()) == []


def test_the_face_check_finds_a_side_door() -> None:
    graph = {"keel.agent": {"keel._run", "keel._run.loop"}, "keel._run.loop": {"keel._run.step"}}
    assert _through_a_side_door(graph) == ["keel.agent -> keel._run.loop"]
