"""Typed Python client of the trainyard REST API, sync and asyncio.

    from trainyard.client import TrainyardClient

    with TrainyardClient() as c:                      # TRAINYARD_URL / TRAINYARD_API_KEY
        job = c.submit("examples/cpu-full-finetune.yaml")
        done = c.wait(job.id, on_progress=lambda p: print(p.state, p.step, p.loss))
        print(done.state, done.cost_usd)

Documents are the pydantic models of :mod:`trainyard.api_models` (the API's own response models).
"""

from typing import TYPE_CHECKING, Any

from trainyard.client._core import resolve_api_key
from trainyard.client.client import TERMINAL_STATES, TrainyardClient
from trainyard.client.progress import JobProgress

if TYPE_CHECKING:
    from trainyard.client.aio import AsyncTrainyardClient

__all__ = ["TERMINAL_STATES", "AsyncTrainyardClient", "JobProgress", "TrainyardClient", "resolve_api_key"]


def __getattr__(name: str) -> Any:
    # the asyncio client (and asyncio itself) is imported on first use: most scripts never need it
    if name == "AsyncTrainyardClient":
        from trainyard.client.aio import AsyncTrainyardClient

        return AsyncTrainyardClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
