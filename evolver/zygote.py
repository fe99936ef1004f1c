"""A warm worker factory: imports tau2 and litellm once, then forks one fresh worker per evaluation.

Importing tau2 and litellm takes 5-7 s on 2 cores; a loop iteration runs several
evaluations. The zygote pays that once per controller. Each worker is a fresh
fork that has never imported a candidate, so candidate code still runs only in
its own process, with its own process group, killable by the controller.

Protocol, one JSON object per line:
  controller -> zygote  {"request": path, "log": path, "cwd": dir, "env": {...}}
  zygote -> controller  {"ready": true} once, then {"pid": N} per request and
                        {"exit": N, "code": C} when that worker ends.

The zygote runs no threads (fork from a threaded process is unsafe); it polls
its parent and exits, killing its workers, when the controller is gone.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys


def _send(obj: dict) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def _child(req: dict) -> None:
    """In the forked worker: own process group, own log, the controller's environment."""
    os.setsid()
    fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    code = 1
    try:
        from evolver import worker

        code = worker.main([req["request"]])
    except BaseException:  # noqa: BLE001 - report and exit; never return into the zygote's loop
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> int:
    parent = os.getppid()
    from evolver import worker

    worker.preload()
    _send({"ready": True})
    children: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([0], [], [], 0.2)
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)
                _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
            if os.getppid() != parent:
                return 0
            if not readable:
                continue
            line = sys.stdin.readline()
            if not line:  # the controller closed the pipe
                return 0
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(req)
            children.add(pid)
            _send({"pid": pid})
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    raise SystemExit(main())
