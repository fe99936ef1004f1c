"""Stands in for mlflow where it must not be imported or must look uninstalled (put this folder first
on PYTHONPATH): importing it records who did, in EVOLVER_TEST_MLFLOW_TRIPWIRE when that is set, and fails
as a missing package does."""

import os
import sys

if os.environ.get("EVOLVER_TEST_MLFLOW_TRIPWIRE"):
    with open(os.environ["EVOLVER_TEST_MLFLOW_TRIPWIRE"], "a") as fh:
        fh.write(f"pid {os.getpid()}: {' '.join(sys.argv)}\n")
raise ModuleNotFoundError("No module named 'mlflow'", name="mlflow")
