"""Processes of the end-to-end tests: started in a process group of their own, stopped
with SIGTERM (SIGKILL when they do not exit)."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest


def start(cmd, log: Path, **kw):
    """Starts a process in its own process group, stdout piped, stderr to `log`."""
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                            stderr=open(log, "w"), text=True, start_new_session=True, **kw)


def wait_ready(p, what, log: Path, timeout=30):
    """Waits for the line `ready...` a refpipe process prints on stdout."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stdout.readline()
        if line.startswith("ready"):
            return
        if not line and p.poll() is not None:
            break
    pytest.fail(f"{what} not ready: {log.read_text()[-2000:]}")


def stop(p, timeout=30):
    """SIGTERM to the process group; returns stdout after the exit."""
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
    return out
