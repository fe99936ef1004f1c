"""Open a local page in headless Chromium (Debian's `chromium`) and tell what a person would see.

Driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages ended by
a NUL byte on file descriptors 3 and 4), with the standard library only: console errors and
uncaught exceptions, every request the page made, facts the page's own DOM reports, and a
screenshot. The browser gets a fresh profile and is gone when visit() returns.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINT = "headless Chromium is needed to check the HTML report: install it with `apt-get install -y chromium` (Debian)"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise RuntimeError(INSTALL_HINT)
    return path


@dataclass
class Visit:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, its own included
    dom: dict = field(default_factory=dict)  # what the probe returned once it said "ready"
    screenshots: list[Path] = field(default_factory=list)


class _Pipe:
    """Commands out on one pipe, replies and events back on the other, read by a thread."""

    def __init__(self, to_browser: int, from_browser: int):
        self.out = os.fdopen(to_browser, "wb", buffering=0)
        self.inbox = os.fdopen(from_browser, "rb", buffering=0)
        self.replies: dict[int, dict] = {}
        self.events: queue.Queue = queue.Queue()
        self.arrived = threading.Condition()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buffer = b""
        while chunk := self.inbox.read(65536):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    with self.arrived:
                        self.replies[message["id"]] = message
                        self.arrived.notify_all()
                else:
                    self.events.put(message)

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self.out.write(json.dumps(message).encode() + b"\0")
        with self.arrived:
            if not self.arrived.wait_for(lambda: self.next_id in self.replies, timeout=timeout):
                raise TimeoutError(f"Chromium did not answer {method} within {timeout:.0f} s")
            reply = self.replies.pop(self.next_id)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})


def visit(page: Path, probe: str, shots: dict[Path, tuple[int, int]], *, width: int = 1280, timeout: float = 90) -> Visit:
    """Load ``page`` from disk; evaluate the JavaScript expression ``probe`` until it returns an object
    whose ``ready`` is true; then save a PNG for each of ``shots``: path -> (top, height) in CSS pixels,
    the page's width (height 0: to the end of the page)."""
    binary = chromium()
    profile = tempfile.mkdtemp(prefix="evolver-chromium-")
    to_read, to_browser = os.pipe()
    from_browser, to_write = os.pipe()
    # The browser wants its end of each pipe as descriptors 3 and 4 (to_read < to_write: pipes take the lowest free
    # ones). bash, not sh: dash redirects descriptors up to 9 only, and under pytest these are higher.
    stray = " ".join(f"{fd}>&-" for fd in (to_read, to_write) if fd not in (3, 4))
    shell = f'exec "$0" "$@" 3<&{to_read} 4>&{to_write} {stray}'
    # A session of its own: whatever the browser leaves running when it exits can be stopped as one group.
    proc = subprocess.Popen(
        ["bash", "-c", shell, binary, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
        pass_fds=(to_read, to_write),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(to_read)
    os.close(to_write)
    result = Visit()
    try:
        pipe = _Pipe(to_browser, from_browser)
        target = pipe.call("Target.createTarget", url="about:blank")["targetId"]
        session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            pipe.call(f"{domain}.enable", session)
        pipe.call("Emulation.setDeviceMetricsOverride", session, width=width, height=900, deviceScaleFactor=1, mobile=False)
        pipe.call("Page.navigate", session, url=page.resolve().as_uri())
        deadline = time.monotonic() + timeout
        loaded = False
        while True:
            loaded = "Page.loadEventFired" in _drain(pipe, result, session) or loaded
            if loaded:
                found = pipe.call("Runtime.evaluate", session, expression=probe, returnByValue=True)
                value = found.get("result", {}).get("value")
                if isinstance(value, dict) and value.get("ready"):
                    result.dom = value
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{page} did not get ready in {timeout:.0f} s; last probe: {locals().get('value')}")
            time.sleep(0.2)
        time.sleep(0.5)  # late console messages and requests
        _drain(pipe, result, session)
        page_height = int(pipe.call("Page.getLayoutMetrics", session)["cssContentSize"]["height"]) + 1
        pipe.call("Emulation.setDeviceMetricsOverride", session, width=width, height=page_height, deviceScaleFactor=1, mobile=False)
        for path, (top, height) in shots.items():
            clip = {"x": 0, "y": top, "width": width, "height": min(height or page_height, page_height - top), "scale": 1}
            shot = pipe.call("Page.captureScreenshot", session, timeout=60, format="png", clip=clip)
            path.write_bytes(base64.b64decode(shot["data"]))
            result.screenshots.append(path)
        try:
            pipe.call("Browser.close", timeout=10)
        except (TimeoutError, RuntimeError, OSError):
            pass
    finally:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _stop_group(proc.pid)
        shutil.rmtree(profile, ignore_errors=True)
    return result


def _stop_group(pgid: int, timeout: float = 10) -> None:
    """Kill what is left of the browser's process group (renderers, its zygote) and wait until it is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise RuntimeError(f"Chromium's processes (group {pgid}) outlived SIGKILL for {timeout:.0f} s")


def _drain(pipe: _Pipe, result: Visit, session: str) -> list[str]:
    """Record the page's events that arrived so far into ``result``; returns their names."""
    seen = []
    while True:
        try:
            event = pipe.events.get_nowait()
        except queue.Empty:
            return seen
        if event.get("sessionId") != session:
            continue
        method, params = event.get("method"), event.get("params", {})
        seen.append(method)
        if method == "Network.requestWillBeSent":
            result.requests.append(params["request"]["url"])
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            result.console_errors.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            result.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            result.console_errors.append(f"{params['entry'].get('source')}: {params['entry'].get('text')} {params['entry'].get('url', '')}")
