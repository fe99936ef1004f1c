"""evolver: evolve a tau2-bench agent's harness, keeping only changes a statistical gate confirms."""

__version__ = "0.1.0"
