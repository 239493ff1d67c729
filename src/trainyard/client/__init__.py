"""Typed Python client of the trainyard REST API, sync and asyncio.

    from trainyard.client import TrainyardClient

    with TrainyardClient() as c:                      # TRAINYARD_URL / TRAINYARD_API_KEY
        job = c.submit("examples/cpu-full-finetune.yaml")
        done = c.wait(job.id, on_progress=lambda p: print(p.state, p.step, p.loss))
        print(done.state, done.cost_usd)

Documents are the pydantic models of :mod:`trainyard.api_models` (the API's own response models).
"""

from trainyard.client._core import resolve_api_key
from trainyard.client.aio import AsyncTrainyardClient
from trainyard.client.client import TERMINAL_STATES, TrainyardClient
from trainyard.client.progress import JobProgress

__all__ = ["TERMINAL_STATES", "AsyncTrainyardClient", "JobProgress", "TrainyardClient", "resolve_api_key"]
