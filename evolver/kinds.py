"""The pluggable kinds, each declared once: how candidates are proposed, what a run's gate bounds, where simulations run.

A kind is a name, the line that says what it does (its choice in `--help`, evolver.toml's comment and
docs/configuration.md), the settings only it reads, and where its implementation is: "module:attribute" within
the package that builds the kind (evolver.evolution.proposers, evolver.evolution.gate, evolver.evaluation.backends),
which loads it; this module sits at the bottom and names no module above it. The settings choose by name
(config.py reads the names here); everything a kind does beyond its name is its implementation's. Adding one is a
module behind the kind's interface (proposers.Proposer, gate.search.Policy, evaluation.backends.Backend) and an
entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kind:
    name: str
    doc: str  # one line
    target: str  # "module:attribute" in the building package: the proposer class, the policy's builder, the backend's opener
    settings: tuple[str, ...] = ()  # the settings only this kind reads

    def load(self, package: str) -> Any:
        """The implementation, from ``package`` (the caller's own: the kind's package)."""
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(f"{package}.{module}"), attribute)


def registry(*kinds: Kind) -> dict[str, Kind]:
    return {k.name: k for k in kinds}


PROPOSERS = registry(
    Kind(
        "agent",
        "the meta model reads trajectories and code, edits a copy and tries it, with tools",
        "agent:Investigator",
        ("proposer_turns", "proposer_tokens", "proposer_tries", "proposer_seconds"),
    ),
    Kind("oneshot", "one answer to the failure digest", "oneshot:OneShot", ("digest_chars",)),
    Kind(
        "command",
        "an external coding agent in a confined workspace",
        "command:CommandProposer",
        ("proposer_command", "proposer_env", "proposer_read", "proposer_seconds"),
    ),
)

GATE_POLICIES = registry(
    Kind(
        "population",
        "a pool of candidates, each child screened on a few analysis tasks beside its parent before any gate trial; "
        "the pool's best audited against the base",
        "search:population_policy",
    ),
    Kind(
        "audited",
        "one lineage under a lenient gate; its best audited against the base",
        "search:audited_policy",
        ("gate_stages", "gate_min_effect"),
    ),
    Kind(
        "per-decision",
        "one lineage; every keep's false-accept rate at most gate_alpha, no audit",
        "search:per_decision_policy",
        ("gate_stages", "gate_min_effect"),
    ),
)

BACKENDS = registry(
    Kind("local", "this machine", "local:open_local"),
    Kind("ray", "a Ray cluster (with no address, a local Ray instance evolver starts and stops)", "ray:open_ray", ("ray_address",)),
)


# The setting that chooses each kind.
CHOSEN_BY = {"proposer": PROPOSERS, "gate_policy": GATE_POLICIES, "backend": BACKENDS}


def choices_text(kinds: dict[str, Kind]) -> str:
    """The kinds for a setting's help: "a (what a does), b (what b does)"."""
    return "; ".join(f"{k.name}: {k.doc}" for k in kinds.values())
