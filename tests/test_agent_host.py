"""What the zygote warms for agent processes (evolver.evaluation.agent_host.prepare) answers
exactly as the libraries would, without the work they would redo in every forked process."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field
from pydantic._internal import _fields, _generate_schema, _typing_extra

from evolver.evaluation import agent_host


@pytest.fixture(scope="module", autouse=True)
def prepared():
    agent_host.prepare()


def test_builtin_default_factories_are_answered_without_asking_inspect(monkeypatch):
    def no_signature(_):
        raise AssertionError("inspect.signature called (it copies sys.modules in every agent process)")

    monkeypatch.setattr(_typing_extra, "signature", no_signature)
    for factory in agent_host.BUILTIN_FACTORIES:
        assert _fields.takes_validated_data_argument(factory) is False
        assert _generate_schema.takes_validated_data_argument(factory) is False

    class State(BaseModel):  # the template's pattern: this class is built with no signature asked
        notes: list[str] = Field(default_factory=list)
        seen: dict[str, int] = Field(default_factory=dict)

    assert State().notes == [] and State().seen == {}


def test_other_default_factories_still_reach_pydantic():
    assert _fields.takes_validated_data_argument(lambda data: data) is True
    assert _fields.takes_validated_data_argument(lambda: 0) is False

    class State(BaseModel):
        turns: int = 0
        label: str = Field(default_factory=lambda data: f"turn {data['turns']}")

    assert State(turns=3).label == "turn 3"
