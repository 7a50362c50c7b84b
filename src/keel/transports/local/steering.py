"""The call a run's required first turn is steered to, named in its control (issue 25): the
local model's rules, which `LocalTransport.first_call` offers the run (`SteersFirstCall` in
keel/transports/base.py); the run core holds none of them.

A small model follows a call it is shown, exactly (issue 26: it followed each `read_file` call
a result named), and little else: told only to start with a tool, the local model listed
``/path/to/repository`` four times for a question naming a constant, and read a module's
whole text for a question about its imports, then could not find them in it. So when the
question names what to look at, the first turn's control names the call that looks at it,
chosen by the question's words, among the tools the run offers:

- a Python file and its imports or dependencies: `search_files` for the lines starting with
  ``from`` or ``import`` in that file (its imports, nothing else);
- a Python file and a function in it (``decide_mode``, with "function", "parameters", "takes"
  ...): `search_files` for its ``def`` line in that file, whose result shows the lines after
  it, the parameters among them (its whole file, read first, was cut before the function);
- a Python file and what it exports (``__all__``): `search_files` for its ``__all__ =`` line,
  whose result likewise shows the names listed after it;
- any other file: `read_file` on it, the path as the question writes it;
- no file, but a name in code style (``MAX_READ_LINES``, ``decide_mode``): `search_files` for
  it;
- nothing of the kind (issue 39): `search_files` for the question's most specific word (a
  hyphenated one first, else the longest that is not a common word, a plural's ``s`` dropped,
  case ignored), else `list_files` of the root. Told only to start with a tool, the models
  started such questions with a path they invented (``/path/to/file.txt``,
  ``/keel/replay.txt``, ``example.txt``), got "no such file", and answered from that; the first
  call has to look at what exists. This rule reads no question shape, only its words.

Nothing is forced: the grammar still allows any tool, and the model may choose another.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection

__all__ = ["EXPORT_LINE", "IMPORT_LINES", "first_call"]

_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w.-]+\.\w+|[\w-]+\.(?:py|md|toml|json))\b")
_CODE_NAME = re.compile(r"\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b")
_IMPORTS = re.compile(r"\b(import|imports|depend|depends|dependencies)\b", re.I)
_EXPORTS = re.compile(r"\b(exports?|exported)\b|__all__", re.I)
EXPORT_LINE = "^__all__ = "
_FUNCTION = re.compile(
    r"\b(function|method|parameters?|arguments?|takes?|signature|returns?|def)\b", re.I
)
IMPORT_LINES = "^(from|import) "


def _call(name: str, **arguments: str) -> str:
    return f"{name} {json.dumps(arguments, ensure_ascii=False)}"


def first_call(question: str, tools: Collection[str]) -> str | None:
    """The exact call (``name {arguments}``) that starts on what `question` names, or None."""
    path = next(iter(_PATH.findall(question)), None)
    if path is not None:
        path = path.lstrip("/")
        searches = path.endswith(".py") and "search_files" in tools
        if _IMPORTS.search(question) and searches:
            return _call("search_files", pattern=IMPORT_LINES, path=path)
        if _EXPORTS.search(question) and searches:
            return _call("search_files", pattern=EXPORT_LINE, path=path)
        function = _function_named(question, path)
        if function is not None and searches:
            return _call("search_files", pattern=f"def {function}\\b", path=path)
        return _call("read_file", path=path) if "read_file" in tools else None
    names = _CODE_NAME.findall(question)
    if names and "search_files" in tools:
        return _call("search_files", pattern=names[0])
    word = _specific_word(question)
    if word is not None and "search_files" in tools:
        return _call("search_files", pattern=f"(?i){word}")  # letters, digits, "-"
    return _call("list_files", path=".") if "list_files" in tools else None


_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*")
_COMMON_WORDS = """
    about above after again against also answer answers before being below between both
    could does doing done during each every file files from have having here itself just
    keel many more most much name named names other over same should some such than that
    their them then there these they this those through under until very were what when
    where which while whom whose with within without would your code value values does
    happen happens return returns work works used uses using make makes made give gives
"""
_COMMON = frozenset(_COMMON_WORDS.split())


def _specific_word(question: str) -> str | None:
    """The question's most specific word: a hyphenated one first, else the longest word of
    four letters or more that is not a common one; a plural's final ``s`` dropped."""
    found: list[str] = _WORD.findall(question)
    words = [w for w in found if len(w) >= 4 and w.lower() not in _COMMON]
    if not words:
        return None
    joined = [w for w in words if "-" in w]
    word = joined[0] if joined else max(words, key=len)
    if len(word) > 5 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return word.lower()


def _function_named(question: str, path: str) -> str | None:
    """The lower-case code name a question about a function names, outside the path."""
    if not _FUNCTION.search(question):
        return None
    rest = question.replace(path, " ")
    return next((n for n in _CODE_NAME.findall(rest) if n.islower()), None)
