"""`evolver daemon`: the warm worker daemon's status, or asking it to stop."""

from __future__ import annotations

import argparse
import time


def cmd_daemon(args: argparse.Namespace) -> int:
    from evolver.evaluation import zygote_client

    if args.action == "stop":
        print(f"asked {zygote_client.stop_all()} daemon(s) to stop; each exits once its current evaluations end")
        return 0
    daemons = zygote_client.running()
    if not daemons:
        print(f"no daemon running (in {zygote_client.runtime_dir()})")
    for path, info in daemons:
        age = time.time() - info["started"]
        state = "stopping" if info["stopping"] else "current code" if info["current"] else "older code, exits when idle"
        print(
            f"pid {info['pid']}: up {age / 60:.1f} min, {info['served']} process(es) forked, {info['workers']} running, "
            f"{info['clients'] - 1} other client(s), idle limit {info['idle_seconds']:g} s, {state}; {path}"
        )
    return 0
