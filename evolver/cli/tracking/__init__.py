"""Experiment tracking of `evolver run`: an optional subscriber on the run's events (evolver.events).

With `track = "off"` (the default) nothing here imports a tracker's package. With
`track = "mlflow"` (the optional extra: pip install 'evolver[mlflow]') the settings,
each iteration's metrics and verdicts, and the run report go to MLflow. The run
directory stays the record: a tracker holds a copy that its own tools browse and compare.
"""

from __future__ import annotations

from rich.console import Console

from evolver.errors import UsageError
from evolver.events import Events
from evolver.store.rundir import RunDir

INSTALL = {"mlflow": "pip install 'evolver[mlflow]'"}


def require(track: str) -> None:
    """Refuse a tracker whose package is missing, before a run writes anything."""
    if track == "off":
        return
    try:
        __import__(track)
    except ImportError as exc:
        raise UsageError(
            f"track = {track} needs the {track} package, which cannot be imported ({exc}); "
            f"install it with `{INSTALL[track]}`, or set track = off"
        ) from None


def subscribe(events: Events, run: RunDir, track: str, console: Console) -> None:
    """Add the run's tracker to its events; with track "off", do nothing and import nothing."""
    if track == "off":
        return
    require(track)
    from evolver.cli.tracking.mlflow_tracker import MlflowTracker

    try:
        tracker = MlflowTracker(run, console)
    except Exception as exc:  # a tracking URI that is wrong or unreachable: say so in one line
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UsageError(
            f"MLflow tracking could not start ({type(exc).__name__}: {first}); fix MLFLOW_TRACKING_URI or set track = off, "
            f"then continue with `evolver run --resume {run.run_id}`"
        ) from None
    events.subscribe(tracker)
