"""The meta-LLM's prompts: every text a proposer sends it lives in prompts/ (shipped in the wheel as evolver.prompts),
in the folder of the proposer that sends it:

    prompts/Harness.md               the guide, which every proposer hands on
    prompts/<proposer>/<name>.md     one message or file the meta-LLM reads whole (oneshot/propose.md, agent/system.md,
                                     command/task.md), sent as the file holds it
    prompts/<proposer>/texts.toml    that proposer's short texts by name: the notes it adds to a conversation, the
                                     optional parts of its messages, what stands in for an empty part
    prompts/agent/tools.toml         the tools the investigating proposer offers, as the meta-LLM reads them

A field is written $name in a text and filled in by name where the text is used (the guide is $harness_guide,
the failure digest $digest); a field left unfilled is an error, never a "$name" sent to the model. What a tool
or a check answers (a refusal, a search's lines, why a patch does not apply) is not a prompt: it stays with the
code that finds it.
"""

from __future__ import annotations

import string
import tomllib
from functools import cached_property
from importlib import resources
from pathlib import Path

from evolver.errors import UsageError

PACKAGED = Path(str(resources.files("evolver.prompts")))  # prompts/ in a checkout, evolver/prompts/ in the wheel


class Prompts:
    """One proposer's prompts, from ``root`` (a Request's prompts_dir; the installed ones by default)."""

    def __init__(self, proposer: str, root: Path = PACKAGED):
        self.folder = Path(root) / proposer

    def text(self, name: str, **fields: object) -> str:
        """<name>.md with its fields filled in."""
        return fill(self._read(f"{name}.md"), **fields)

    def short(self, name: str, **fields: object) -> str:
        """The short text ``name`` of texts.toml ("table.key" in a table) with its fields filled in."""
        entry = self._texts
        for key in name.split("."):
            entry = entry[key]
        return fill(entry, **fields)

    def shorts(self, name: str) -> list[str]:
        """The list of short texts ``name`` of texts.toml (they have no fields)."""
        return [fill(text) for text in self._texts[name]]

    def data(self, name: str) -> dict:
        """<name>.toml as it is written."""
        return tomllib.loads(self._read(f"{name}.toml"))

    @cached_property
    def _texts(self) -> dict:
        return self.data("texts")

    def _read(self, file: str) -> str:
        path = self.folder / file
        if not path.exists():
            raise UsageError(f"prompt template {path} is missing; restore it from the evolver repository")
        return path.read_text()


def fill(template: str, **fields: object) -> str:
    return string.Template(template).substitute(fields)


def sentences(*parts: str) -> str:
    """The parts one after the other with a space between, the empty ones left out."""
    return " ".join(part for part in parts if part)
