"""Pristine agent templates; shipped in the wheel as evolver.baseline."""
