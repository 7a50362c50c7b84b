"""The options that shape an agent run, declared once (ADR 0045).

Each `Option` carries its flag, its environment variable, its `keel.toml` key, its default and
its help. Everything else is derived from this table: the command line's options (`keel run`,
`ask`, `serve`, `submit` take the same ones, see `keel/cli/flags.py`), the keys a
`keel.toml` may hold, and the run's `Limits`: every field of `Limits` is an option, so a new
limit appears on the command line and in `keel.toml` without another edit.

`resolve` applies one order to every option, flag > environment > `keel.toml` > default, and
says where each value came from; the run saves that (`keel show` prints it). The model and its
base URL are the one pair resolved together (`keel.models.choose_model`): a base URL is taken
only from the place the model came from, so `--model openai:...` never sends a key to a
`KEEL_BASE_URL` someone set for another model. An option renamed (ADR 0058) is still read under
its former flag, variable and key, after the new one at each place, with a note on stderr.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from keel.errors import ConfigError
from keel.limits import RENAMED, Limits

__all__ = [
    "OPTIONS",
    "TOML_KEYS",
    "Option",
    "Resolved",
    "agent_tables",
    "note_renamed",
    "option",
    "read_schema",
    "resolve",
    "resolve_one",
    "unknown_keys",
]

Kind = Literal["str", "int", "float", "bool", "path", "list"]
"""What an option's value is; how a value from the environment (always text) is read."""


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    """The Python name: the command's parameter and the key of `Resolved.values`."""
    kind: Kind
    help: str
    default: Any = None
    flag: str | None = None
    """The command-line flag; None: `--` and the name, dashed. A bool gets its `--no-` twin."""
    env: str | None = None
    """The environment variable; None: `KEEL_` and the name, upper case. "": none."""
    toml: str | None = None
    """The `keel.toml` key; None: the name. "": none."""
    limit: bool = False
    """A field of `Limits` (the run's budgets and loop rules)."""
    default_help: str | None = None
    """What `--help` says of the default when it is not a plain value."""
    formerly: str | None = None
    """The option's name before a rename (ADR 0058): its flag, variable and keel.toml key are
    still read, each with a note on stderr naming the new spelling."""

    @property
    def former(self) -> Option | None:
        """The option as it was spelled before its rename: its flag, variable and key."""
        if self.formerly is None:
            return None
        return Option(self.formerly, self.kind, f"Former name of {self.flag_name}.")

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def env_name(self) -> str | None:
        if self.env == "":
            return None
        return self.env or "KEEL_" + self.name.upper()

    @property
    def toml_key(self) -> str | None:
        if self.toml == "":
            return None
        return self.toml or self.name

    @property
    def help_text(self) -> str:
        shown = self.default_help
        if shown is None and self.default is not None and self.kind != "bool":
            shown = str(self.default)
        if shown is None and self.kind == "bool" and self.default is not None:
            shown = "on" if self.default else "off"
        return self.help if shown is None else f"{self.help} [default: {shown}]"


def option(help: str, **extra: Any) -> dict[str, Any]:
    """Field metadata for a `Limits` field: its help, and any `Option` setting beside it."""
    return {"help": help, **extra}


_LIMIT_KINDS: dict[str, Kind] = {"int": "int", "float": "float", "bool": "bool", "str": "str"}


def _limit_options() -> list[Option]:
    """One option per field of `Limits`, its default the field's own."""
    found = []
    formerly = {new: old for old, new in RENAMED.items()}
    for field in dataclasses.fields(Limits):
        meta = dict(field.metadata)
        if meta.pop("cli", True) is False:
            continue
        annotation = str(field.type).replace(" | None", "")
        kind = _LIMIT_KINDS.get(annotation, "str")
        meta.setdefault("formerly", formerly.get(field.name))
        found.append(
            Option(field.name, kind, meta.pop("help"), default=field.default, limit=True, **meta)
        )
    return found


_SPECS = (
    "local (the embedded 1.5B), local:0.5b, local:PATH (a GGUF file), openai:MODEL, "
    "openai-chat:MODEL, anthropic:MODEL, xml:SPEC or script:FILE"
)

OPTIONS: tuple[Option, ...] = (
    Option("model", "str", f"Model spec: {_SPECS}.", default_help="see `keel models`"),
    Option(
        "base_url",
        "str",
        "Server for openai-chat:/openai:/anthropic: (e.g. a local llama.cpp).",
    ),
    Option(
        "api_key_env",
        "str",
        "Send the key in this environment variable to --base-url (a provider's own key "
        "from the environment goes only to the provider's own host).",
        default_help="a placeholder",
    ),
    Option(
        "tool_choice",
        "str",
        "tool_choice to send on ordinary turns: auto, required or none (servers that ignore "
        "tools without it, e.g. llama-cpp-python's chatml-function-calling).",
        default_help="not sent",
    ),
    Option(
        "store",
        "str",
        "SQLite file of runs, or a postgresql:// URL.",
        default_help="KEEL_STORE, keel.toml, else a file under the user data directory",
    ),
    Option(
        "repo",
        "path",
        "Folder the file tools may read (nothing outside it).",
        default_help="the current folder, named before the run starts",
    ),
    Option(
        "allow_host",
        "list",
        "Let fetch reach this loopback/private host (repeatable).",
        toml="allow_hosts",
        env="KEEL_ALLOW_HOSTS",
    ),
    Option(
        "search",
        "str",
        "Offer web_search over this backend: searxng:URL (a SearXNG instance; a loopback or "
        "private one needs --allow-host), local:DIR (a folder indexed by keel index DIR), "
        "tavily (its key in TAVILY_API_KEY) or exa (its key in EXA_API_KEY).",
        default_help="no web_search",
    ),
    Option(
        "hosted_tool",
        "list",
        "Let the model's provider run this tool of its own: web_search (openai:, anthropic:), "
        "web_fetch (anthropic:) or file_search:stores=VS_ID (openai:); options after colons, "
        "e.g. web_search:max_uses=3:domains=a.org+b.org (repeatable; billed per call, never "
        "approved or re-run by Keel).",
        toml="hosted_tools",
        env="KEEL_HOSTED_TOOLS",
        default_help="none",
    ),
    Option(
        "allow_writes",
        "bool",
        "Offer write_file under --repo (each write asks approval).",
        default=False,
    ),
    Option("approve_tools", "list", "Tools whose calls are pre-approved (comma-separated)."),
    Option(
        "without_tool",
        "list",
        "Leave out this built-in tool (e.g. fetch, for an MCP one; repeatable).",
        toml="without_tools",
        env="KEEL_WITHOUT_TOOLS",
    ),
    Option(
        "browser", "bool", "Offer browser_observe/browser_act (headless Chromium).", default=False
    ),
    Option(
        "mcp",
        "list",
        'An MCP server to start: "CMD ARGS", or "prefix=NAME_:CMD ARGS" to put NAME_ before '
        "its tool names (repeatable; keel.toml: [[mcp]] tables in your own config folder).",
        env="",
        toml="",
    ),
    Option(
        "mcp_env",
        "list",
        "Set NAME=VALUE in the environment of the --mcp servers (repeatable; only the name "
        "is saved: a resume reads VALUE from Keel's environment).",
        env="",
        toml="",
    ),
    Option(
        "mcp_url",
        "list",
        'An MCP server at this streamable HTTP URL (or "prefix=NAME_:URL").',
        env="",
        toml="",
    ),
    Option(
        "durability",
        "str",
        "process: survives a killed process; power: also a power cut (an fsync per step).",
        default="process",
    ),
    Option("output_schema", "path", "A JSON Schema file: the answer must be JSON that matches it."),
    Option(
        "agent",
        "list",
        "Offer the sub-agent declared as [agents.NAME] in keel.toml, as a tool whose calls "
        "are child runs (repeatable).",
        env="",
        toml="",
    ),
    *_limit_options(),
)

BY_NAME = {o.name: o for o in OPTIONS}
FORMER_NAMES = {o.formerly: o for o in OPTIONS if o.formerly is not None}
"""Each renamed option by its former name (ADR 0058), still taken by `agent_from_options`."""
TOML_KEYS: tuple[str, ...] = tuple(
    k for o in OPTIONS for s in (o, o.former) if s is not None and (k := s.toml_key) is not None
)
"""The `keel.toml` keys the options model reads (beside `[[mcp]]`, `[prices]`, `[agents]`),
former names included: they are read, with a note, not reported as unknown."""


@dataclass(frozen=True, slots=True)
class Resolved:
    values: dict[str, Any]
    """Every option's value, by name."""
    sources: dict[str, str]
    """Where each value came from: a flag, a variable, a keel.toml path, or "default"."""
    warnings: tuple[str, ...] = ()
    """keel.toml files that were not believed (untrusted), to be said on stderr."""

    def given(self, name: str) -> bool:
        return self.sources[name] != "default"

    def limits(self) -> Limits:
        """The run's `Limits` from the resolved limit options."""
        return Limits(**{o.name: self.values[o.name] for o in OPTIONS if o.limit})

    def saved(self) -> dict[str, dict[str, Any]]:
        """What the run keeps of its options, for `keel show`: each option not left at its
        default, where it came from, and its value where that is plain and safe to store (not
        a base URL or a store URL, which may hold credentials, nor an MCP command line)."""
        kept: dict[str, dict[str, Any]] = {}
        for name, source in self.sources.items():
            if source == "default":
                continue
            value = self.values[name]
            entry: dict[str, Any] = {"from": source}
            if name not in UNSHOWN:
                entry["value"] = str(value) if isinstance(value, Path) else value
            kept[name] = entry
        return kept


UNSHOWN = frozenset({"base_url", "store", "mcp", "mcp_env", "mcp_url"})


def resolve(
    given: Mapping[str, Any],
    *,
    names: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Resolved:
    """Each option (all, or `names`) from the first place that has it: `given` (the flags; None
    or an empty list is "not given"), the environment, a believed `keel.toml` (the working
    directory's when trusted, then the user's), else its default. A value that cannot be used
    is a ConfigError naming where it came from."""
    from keel.config import config_files

    env = os.environ if env is None else env
    believed, warnings = config_files(cwd)
    files = [(f.path, f.data) for f in believed]
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in names or BY_NAME:
        if name in ("model", "base_url"):
            continue
        values[name], sources[name] = _first(BY_NAME[name], given, env, files)
    if names is None or "model" in names:
        from keel.models import choose_model

        choice = choose_model(given.get("model"), given.get("base_url"), env=env, cwd=cwd)
        values["model"], sources["model"] = choice.spec, choice.source
        values["base_url"] = choice.base_url
        sources["base_url"] = (
            "--base-url" if given.get("base_url") else choice.source if choice.base_url
            else "default"
        )  # fmt: skip
        warnings = list(choice.warnings)
    return Resolved(values, sources, tuple(warnings))


def unknown_keys(cwd: Path | None = None) -> list[str]:
    """A warning for each top-level key of a believed keel.toml that Keel does not read, with
    the closest valid key. A file that cannot be read gives none here: the command that reads
    it says why."""
    from keel.config import TABLES, config_files

    try:
        files, _ = config_files(cwd)
    except ConfigError:
        return []
    keys = (*TOML_KEYS, *TABLES)
    warnings = []
    for found in files:
        for key in found.data:
            if key in keys:
                continue
            close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"the keys are {', '.join(keys)}"
            warnings.append(f"{found.path}: unknown key {key!r} ignored ({hint})")
    return warnings


AGENT_KEYS = ("description", "model", "instructions", "tools", "approve_tools", "agents")
"""What an `[agents.NAME]` table holds beside its limits (any limit's keel.toml key)."""
AGENT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def agent_tables(names: Sequence[str], cwd: Path | None = None) -> dict[str, dict[str, Any]]:
    """The `[agents.NAME]` tables that `--agent` names, from a believed keel.toml, checked,
    as they are saved with the run (so a resume or a worker rebuilds the same children)."""
    from keel.config import config_files

    believed, _ = config_files(cwd)
    found: dict[str, dict[str, Any]] = {}
    wanted = list(names)
    while wanted:  # the agents named, and the agents they may start (`agents = [...]`)
        name = wanted.pop(0)
        if name in found:
            continue
        for config in believed:
            tables = config.data.get("agents")
            if isinstance(tables, dict) and name in tables:
                found[name] = _agent_table(name, tables[name], f"{config.path}: [agents.{name}]")
                if name not in names:  # only started by another agent: not the run's tool
                    found[name]["below"] = True
                wanted += found[name].get("agents") or []
                break
        else:
            raise ConfigError(
                f"--agent {name}: no [agents.{name}] table in a trusted keel.toml (declare it "
                "with a description, and optionally model, instructions, tools and limits)"
            )
    return found


def _agent_table(name: str, table: object, where: str) -> dict[str, Any]:
    if not AGENT_NAME.fullmatch(name):
        raise ConfigError(f"{where}: an agent's name is its tool's name: letters, digits, _ -")
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    limit_keys = {
        key: o
        for o in OPTIONS
        if o.limit
        for s in (o.former, o)  # a key's own spelling last: it wins over a former one
        if s is not None and (key := s.toml_key)
    }
    known = (*AGENT_KEYS, *limit_keys)
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(AGENT_KEYS)}"
            raise ConfigError(f"{where}: unknown key {key!r} ({hint}, or a limit)")
    description = table.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ConfigError(f"{where}: description (what the agent does, for its parent) is needed")
    for key in ("model", "instructions"):
        if key in table and not isinstance(table[key], str):
            raise ConfigError(f"{where}: {key} must be a string")
    tools, approved = table.get("tools"), table.get("approve_tools")
    below = table.get("agents")
    for key, names in (("tools", tools), ("approve_tools", approved), ("agents", below)):
        names_ok = isinstance(names, list) and all(isinstance(t, str) for t in names)
        if names is not None and not names_ok:
            raise ConfigError(f"{where}: {key} must be a list of names")
    limits = {}
    for key, o in limit_keys.items():
        if key in table:
            if key != o.toml_key:
                note_renamed(f"{where} {key}", str(o.toml_key))
            at = f"{where} {key}"
            limits[o.name] = _checked(o, _from_toml(o, table[key], at), at)
    try:
        Limits(**limits)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return {
        "description": description,
        "model": table.get("model"),
        "instructions": table.get("instructions"),
        "tools": tools,
        "approve_tools": approved or [],
        "limits": limits,
        **({"agents": below} if below else {}),  # the agents it may start in turn
    }


def resolve_one(name: str, flag: Any = None, *, cwd: Path | None = None) -> Any:
    """One option's value, resolved as `resolve` does (for commands that take one option)."""
    return resolve({name: flag}, names=[name], cwd=cwd).values[name]


_NOTED: set[str] = set()
"""The former spellings already noted in this process."""


def note_renamed(old: str, new: str) -> None:
    """Say once per process, on stderr, that `old` is a former spelling of `new` (ADR 0058):
    it still works, and the note says what to write instead."""
    if old in _NOTED:
        return
    _NOTED.add(old)
    print(f"keel: {old} is deprecated, it is now {new} (ADR 0058)", file=sys.stderr)


def _first(
    opt: Option,
    given: Mapping[str, Any],
    env: Mapping[str, str],
    files: Sequence[tuple[Path, Mapping[str, object]]],
) -> tuple[Any, str]:
    """At each place in turn (flags, environment, keel.toml files), the option's own spelling,
    then its former one."""
    spellings = [s for s in (opt, opt.former) if s is not None]
    for spelled in spellings:
        flag = given.get(spelled.name)
        if flag is not None and flag != [] and flag != ():
            shown = spelled.flag_name.split("/")[0]
            if spelled is not opt:
                note_renamed(shown, opt.flag_name.split("/")[0])
            return _checked(opt, _from_flag(opt, flag), shown), shown
    for spelled in spellings:
        variable = spelled.env_name
        if variable and env.get(variable):
            if spelled is not opt:
                note_renamed(variable, str(opt.env_name))
            return _checked(opt, _from_text(opt, env[variable], variable), variable), variable
    for path, data in files:
        for spelled in spellings:
            key = spelled.toml_key
            if key is not None and key in data:
                where = f"{path}: {key}"
                if spelled is not opt:
                    note_renamed(where, f"{opt.toml_key} in keel.toml")
                return _checked(opt, _from_toml(opt, data[key], where), where), str(path)
    return opt.default, "default"


def _from_flag(opt: Option, value: Any) -> Any:
    if opt.kind == "list":
        items = [value] if isinstance(value, str) else list(value)
        if opt.name == "approve_tools":  # one comma-separated flag
            items = [t.strip() for item in items for t in str(item).split(",")]
        return [str(i) for i in items if str(i).strip()]
    return value


def _from_text(opt: Option, text: str, where: str) -> Any:
    """A value from an environment variable."""
    text = text.strip()
    try:
        if opt.kind == "int":
            return int(text)
        if opt.kind == "float":
            return float(text)
    except ValueError:
        raise ConfigError(f"{where}={text!r}: {opt.name} must be a {opt.kind}") from None
    if opt.kind == "bool":
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}={text!r}: {opt.name} must be true or false")
    if opt.kind == "list":
        return [t.strip() for t in text.split(",") if t.strip()]
    if opt.kind == "path":
        return Path(text).expanduser()
    return text


def _from_toml(opt: Option, value: object, where: str) -> Any:
    """A value from keel.toml, whose types are TOML's own."""
    wanted: dict[str, tuple[type, ...]] = {
        "int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "path": (str,),
    }  # fmt: skip
    if opt.kind == "list":
        if isinstance(value, str):
            value = [value]
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{where} must be a list of strings, not {value!r}")
        return list(value)
    if (isinstance(value, bool) and opt.kind != "bool") or not isinstance(value, wanted[opt.kind]):
        raise ConfigError(f"{where} must be a {opt.kind}, not {value!r}")
    if opt.kind == "path":
        return Path(cast(str, value)).expanduser()
    if opt.kind == "float":
        return float(cast(float, value))
    return value


def _checked(opt: Option, value: Any, where: str) -> Any:
    """The checks that belong to one option, named after where its value came from."""
    if opt.kind == "float" and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {opt.name} must be a finite number, not {value}")
    if opt.name == "durability":
        from keel.durability import check_durability

        return check_durability(value, where)
    if opt.name in ("loop_policy", "citations"):
        from keel.limits import CITATION_POLICIES, LOOP_POLICIES, closest_policy

        allowed = LOOP_POLICIES if opt.name == "loop_policy" else CITATION_POLICIES
        if value not in allowed:
            raise ConfigError(
                f"{where}: {opt.name.replace('_', ' ')} must be one of {', '.join(allowed)}, "
                f"not {value!r}" + closest_policy(value, allowed)
            )
    return value


def read_schema(path: Path) -> dict[str, Any]:
    """`--output-schema FILE`: a JSON object, else a ConfigError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(
            f"--output-schema {path}: cannot read a JSON Schema from it: {exc}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"--output-schema {path}: a JSON Schema is a JSON object")
    return data
