"""A fourth proposer kind, for tests/test_toy_proposer.py: this file and one entry in evolver.kinds.PROPOSERS are all
a kind needs. It proposes the loop tests' fix (the exact-title rule) every time, and calls no meta-LLM."""

from __future__ import annotations

from evolver.evolution.patch import parse_proposal
from evolver.evolution.proposers import ProposalResult, Proposer, Request
from tests.scripts.loop_cases import PROPOSALS

FIX = PROPOSALS[3]


class Toy(Proposer):
    name = "toy"

    @classmethod
    def meta_shape(cls, meta) -> None:
        return None

    @classmethod
    def meta_tokens(cls, cfg, one_request: int) -> tuple[int, int]:
        return 0, 0

    def propose(self, request: Request) -> ProposalResult:
        return ProposalResult(proposal=parse_proposal(FIX))


def main() -> int:
    """`evolver` with the toy kind registered: its one registry entry, and its module placed in the proposers' package."""
    import sys

    from evolver import kinds

    kinds.PROPOSERS["toy"] = kinds.Kind("toy", "the same fixed edit every time", "toy:Toy")
    sys.modules["evolver.evolution.proposers.toy"] = sys.modules[__name__]
    from evolver.cli.commands import main as evolver

    return evolver(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
