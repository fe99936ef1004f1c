"""A Ray instance for the Ray backend (evolver.evaluation.backends.ray): a local one of its own, started and later
awaited until its zygotes are gone, or a cluster joined at an address that is tried once first."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Optional

from evolver.errors import UsageError

OBJECT_STORE_BYTES = 128 * 1024 * 1024  # a local instance moves only records, trajectories and small archives


def start(ray, address: str, root: Optional[Path]) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # Ray would report usage over the network
    # ray.init replaces the SIGTERM handler with sys.exit; evolver's own (a clean, resumable stop) stays.
    previous = signal.getsignal(signal.SIGTERM)
    quiet = dict(log_to_driver=False, logging_level=logging.ERROR, runtime_env={"env_vars": node_settings(root)})
    try:
        if root is not None:  # "local": a new instance even where RAY_ADDRESS or a running cluster would be joined
            ray.init(
                address="local",
                num_cpus=os.cpu_count() or 1,
                object_store_memory=OBJECT_STORE_BYTES,
                include_dashboard=False,
                _temp_dir=str(root / "ray"),
                **quiet,
            )
        else:
            check_reachable(address)
            try:
                ray.init(address=address, **quiet)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise UsageError(
                    f"cannot join the Ray cluster at '{address}' ({str(exc).strip().splitlines()[0]}); start one "
                    "(ray start --head) or fix --ray-address; a cluster with token authentication needs RAY_AUTH_MODE=token"
                ) from None
    finally:
        if threading.current_thread() is threading.main_thread() and previous is not None:
            signal.signal(signal.SIGTERM, previous)


def check_reachable(address: str) -> None:
    """Ray retries an address that does not answer for minutes: try it once first, for 5 s."""
    if address == "auto":
        return  # Ray finds it (RAY_ADDRESS, or the cluster `ray start` runs here) or says at once that there is none
    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except ValueError:
        raise UsageError(f"--ray-address '{address}' is neither HOST:PORT of a Ray head node nor auto") from None
    except OSError as exc:
        raise UsageError(
            f"cannot reach a Ray cluster at '{address}' ({exc}); start it, or give auto for the one `ray start` runs here"
        ) from None


def node_settings(root: Optional[Path]) -> dict:
    """What the Ray worker processes need before they start a zygote; nothing secret (Ray logs these)."""
    settings = {k: os.environ[k] for k in ("PYTHONPATH", "EVOLVER_ZYGOTE_IDLE") if k in os.environ}
    if root is not None:
        # A zygote of this instance's own, that exits with the last Ray worker holding it (ray_node._keep_zygote_warm).
        settings.update(EVOLVER_RUNTIME_DIR=str(root / "zygote"), EVOLVER_ZYGOTE_IDLE="0")
    return settings


def await_zygotes(directory: Path, timeout: float = 10.0) -> None:
    """Wait until no zygote of a stopped local instance answers (its Ray workers are gone, so are its clients)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(answers(p) for p in directory.glob("zygote-*.sock")):
        time.sleep(0.1)


def answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True
