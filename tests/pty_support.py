"""Run a command in a pseudo-terminal of a fixed size, as a person's terminal would (width and colour
decisions are the program's own), and read back what it drew."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from collections.abc import Sequence
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


@dataclass
class PtyResult:
    returncode: int
    raw: str

    @property
    def text(self) -> str:
        """What the terminal shows, without colour and cursor codes."""
        return ANSI.sub("", self.raw).replace("\r\n", "\n").replace("\r", "\n")

    @property
    def lines(self) -> list[str]:
        return [ln.rstrip() for ln in self.text.split("\n")]


def run_in_pty(
    args: Sequence[str], *, env: dict[str, str], columns: int = 80, rows: int = 40, timeout_s: float = 120.0
) -> PtyResult:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    full_env = {**env, "COLUMNS": str(columns), "LINES": str(rows), "TERM": "xterm-256color"}
    full_env.pop("NO_COLOR", None)
    proc = subprocess.Popen(list(args), stdin=slave, stdout=slave, stderr=slave, env=full_env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise AssertionError(f"{' '.join(args)} did not finish in {timeout_s} s")
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
    return PtyResult(code, b"".join(chunks).decode("utf-8", "replace"))
