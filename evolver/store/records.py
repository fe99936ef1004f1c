"""Reading the run store's JSON records: a damaged file says so in one line, and a versioned record
is brought up to this evolver's schema by named steps, or refused when it is newer.

The run's records (runstate: run.json, state.json, iterations/NNN.json) and an evaluation's results
(evaldir: result-<T>.json) are read through here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, ClassVar

from pydantic import BaseModel, Field, ValidationError, model_validator

from evolver.errors import UsageError


class NewerSchema(ValueError):
    """A run file written by a newer evolver than this one."""


Migration = Callable[[dict], dict]


def migrate(data, what: str, current: int, steps: dict[int, Migration]):
    """``data`` of a record ``what`` (run.json, state.json, an iteration record) brought to schema
    ``current``. A record without "schema" is version 1, the form before records carried one;
    ``steps[n]`` turns the content of version n into that of version n + 1, and the new number is
    stamped on it. A newer version raises NewerSchema. A record built in code passes through the
    steps too (it names no schema): a step leaves what is already in the newer form as it is."""
    if not isinstance(data, dict):
        return data
    version = data.get("schema", 1)
    if not isinstance(version, int) or version > current:
        raise NewerSchema(f"{what} has schema {version!r}, newer than this evolver knows ({current}); upgrade evolver to open it")
    while version < current:
        data, version = {**steps[version](data), "schema": version + 1}, version + 1
    return data


class Versioned(BaseModel):
    """A run record that says its schema first ("schema": N), and is read through its migrations."""

    SCHEMA: ClassVar[int]  # the version this evolver writes
    MIGRATIONS: ClassVar[dict[int, Migration]]  # version n -> the step to n + 1
    WHAT: ClassVar[str]  # the record, as a refusal names it

    schema_version: int = Field(alias="schema")  # always given: the migrations stamp it

    model_config = {"populate_by_name": True, "serialize_by_alias": True}

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data):
        return migrate(data, cls.WHAT, cls.SCHEMA, cls.MIGRATIONS)


def read_record(model, path: Path):
    """A run file, or one line saying it is damaged: a hand edit, a full disk, a bad copy."""
    try:
        return model.model_validate_json(Path(path).read_bytes())
    except ValidationError as exc:
        cause = next((e.get("ctx", {}).get("error") for e in exc.errors() if isinstance(e.get("ctx", {}).get("error"), NewerSchema)), None)
        if cause is not None:
            raise UsageError(f"{path}: {cause}") from None
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise UsageError(
            f"{path} is unreadable or corrupt ({where + ': ' if where else ''}{first['msg']}); restore it from a copy, or start a new run"
        ) from None
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise UsageError(f"{path} is unreadable or corrupt ({why}); restore it from a copy, or start a new run") from None
