"""Reading the settings: `evolver.toml` in the repo, then EVOLVER_* environment variables, then CLI flags,
merged into one Config (evolver.config), every value strictly typed and checked against its Spec.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Optional

from evolver.config import SPECS, Config, flag_of
from evolver.config_tables import parse_llm_args, parse_rate_limits
from evolver.errors import UsageError

CONFIG_FILE = "evolver.toml"
ENV_PREFIX = "EVOLVER_"

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _coerce(name: str, where: str, raw: Any, default: Any) -> Any:
    """The value of one setting from ``where`` (a file, a variable or a flag), strictly typed and in range."""
    kind = type(default)
    if SPECS[name].style == "limits":
        return parse_rate_limits(name, where, raw)
    if kind is dict:
        return parse_llm_args(name, where, raw)
    value, problem = _convert(raw, kind)
    if problem is None:
        problem = _out_of_range(name, value)
    if problem:
        subject = f"{where} {raw}" if where.startswith("--") else f"{where}: {name} = {raw!r}"
        raise UsageError(f"{subject} {problem}; fix it")
    return value


def _convert(raw: Any, kind: type) -> tuple[Any, Optional[str]]:
    if kind is list:
        return ([str(x) for x in raw] if isinstance(raw, list) else [x.strip() for x in str(raw).split(",") if x.strip()]), None
    if kind is bool:
        if isinstance(raw, bool):
            return raw, None
        text = str(raw).strip().lower()
        return (text in TRUE, None) if text in TRUE + FALSE else (None, "is not true or false")
    if kind is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw, None
        text = str(raw).strip()
        return (int(text), None) if not isinstance(raw, (bool, float)) and text.lstrip("+-").isdigit() else (None, "is not a whole number")
    if kind is float:
        try:
            value = float(raw) if not isinstance(raw, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or value != value or value in (float("inf"), float("-inf")):
            return None, "is not a finite number"
        return value, None
    return str(raw), None


def _out_of_range(name: str, value: Any) -> Optional[str]:
    spec = SPECS[name]
    if spec.choices and value not in spec.choices:
        return f"is not one of: {', '.join(c for c in spec.choices if c)}" + (", or empty" if "" in spec.choices else "")
    if spec.positive and value <= 0:
        return "must be more than 0 seconds"
    if name == "gate_alpha" and not 0 < value < 0.5:
        return "must be between 0 and 0.5 (a false-accept probability)"
    low, high = spec.bounds
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            return f"must be at least {low:g}"
        return f"must be between {low:g} and {high:g}"
    return None


def load_config(repo: Path, overrides: Optional[dict] = None, environ: Optional[dict] = None) -> Config:
    """Merge file < environment < CLI overrides (None values in overrides are ignored); one check for all three."""
    environ = os.environ if environ is None else environ
    values = asdict(Config())  # the defaults, then each source on top
    known = {f.name: f for f in fields(Config)}
    path = Path(repo) / CONFIG_FILE
    if path.exists() or path.is_symlink():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path} is not valid TOML ({exc}); fix the file or remove it") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"cannot read {path} ({getattr(exc, 'strerror', None) or exc}); make it a readable TOML file or remove it"
            ) from None
        for key, value in data.items():
            if key in known and SPECS[key].flag_only:
                raise UsageError(f"{path}: '{key}' may only be given as the --{key.replace('_', '-')} flag")
            if key not in known:
                raise UsageError(f"{path}: unknown key '{key}'; known keys: {', '.join(sorted(known))}")
            _set(values, key, _coerce(key, str(path), value, values[key]))
    for key in known:
        env_value = environ.get(ENV_PREFIX + key.upper())
        if env_value not in (None, "") and SPECS[key].flag_only:
            raise UsageError(
                f"{ENV_PREFIX + key.upper()} is not read: '{key}' may only be given as the --{key.replace('_', '-')} flag; unset it"
            )
        if env_value not in (None, ""):
            _set(values, key, _coerce(key, f"environment variable {ENV_PREFIX + key.upper()}", env_value, values[key]))
    for key, value in (overrides or {}).items():
        if value is not None:
            _set(values, key, _coerce(key, flag_of(key), value, values[key]))
    return Config(**values)


def _set(values: dict, key: str, value: Any) -> None:
    """A later source wins; for a table of model arguments, key by key (a flag adds to the file's table)."""
    current = values[key]
    values[key] = {**current, **value} if isinstance(current, dict) else value


def checked(name: str, raw: Any, where: str) -> Any:
    """One setting checked on its own (e.g. --iterations on resume), as load_config checks them all."""
    return _coerce(name, where, raw, getattr(Config(), name))
