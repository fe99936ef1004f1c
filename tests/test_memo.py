"""evolver.memo: a pure computation's result kept in evolver's cache by its inputs and its code."""

from __future__ import annotations

import math

from evolver import memo


def test_a_result_is_kept_by_inputs_and_code_and_a_damaged_file_is_computed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLVER_CACHE", str(tmp_path / "cache"))
    code = tmp_path / "code.py"
    code.write_text("v = 1\n")
    calls = []

    def compute(value):
        return lambda: calls.append(value) or value

    assert memo.remembered("kind", {"a": [1.0, None]}, [code], compute(0.25)) == 0.25
    assert memo.remembered("kind", {"a": [1.0, None]}, [code], compute(0.5)) == 0.25  # kept: not computed again
    assert memo.remembered("kind", {"a": [1.0, 0.0]}, [code], compute(0.5)) == 0.5  # other inputs
    code.write_text("v = 2\n")
    assert memo.remembered("kind", {"a": [1.0, None]}, [code], compute(0.75)) == 0.75  # other code
    assert calls == [0.25, 0.5, 0.75]
    files = sorted((tmp_path / "cache" / "kind").glob("*.json"))
    assert len(files) == 3 and not list((tmp_path / "cache" / "kind").glob("*.tmp"))
    for damaged in ("{", '{"version": 1, "key": "another", "value": 9}', "[]"):
        for f in files:
            f.write_text(damaged)
        assert memo.remembered("kind", {"a": [1.0, None]}, [code], compute(0.75)) == 0.75
    assert calls == [0.25, 0.5, 0.75] * 1 + [0.75] * 3
    assert memo.remembered("inf", {}, [], compute(math.inf)) == math.inf  # JSON has no infinity: kept as null
    assert memo.remembered("inf", {}, [], compute(0.1)) == math.inf


def test_a_cache_that_cannot_be_written_still_gives_the_result(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("EVOLVER_CACHE", str(blocked / "below-a-file"))
    assert memo.remembered("kind", {}, [], lambda: 0.3) == 0.3
