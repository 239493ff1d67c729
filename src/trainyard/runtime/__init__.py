"""Code that runs inside training processes: trainer, checkpoints, preemption, events, the user SDK.

``trainyard.runtime.init()`` is the SDK entry for users' own scripts (see ``runtime.sdk``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.runtime.sdk import Session


def init() -> Session:
    """Join the job this process belongs to: checkpoints, preemption notice, reports (``runtime.sdk``)."""
    from trainyard.runtime.sdk import init as _init

    return _init()


__all__ = ["init"]
