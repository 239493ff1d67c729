"""The web dashboard: server-rendered pages at ``/``, charts drawn in the browser by the vendored uPlot
library, live job pages that poll JSON, and static assets served from this package (no CDN).
:func:`install_dashboard` adds it to an app from ``create_app``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STATIC_DIR = Path(__file__).parent / "static"

__all__ = ["STATIC_DIR", "install_dashboard"]


def install_dashboard(app: Any, platform: Any) -> None:
    """Include the dashboard routes, mount ``/static`` and give the app a session store for logins."""
    from starlette.staticfiles import StaticFiles

    from trainyard.web.lifecycle_routes import router as lifecycle_router
    from trainyard.web.routes import router
    from trainyard.web.session import SessionStore

    app.state.web_sessions = SessionStore(clock=platform.options.clock)
    app.include_router(router)
    app.include_router(lifecycle_router)
    app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")
