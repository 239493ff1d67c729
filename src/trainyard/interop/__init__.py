"""Hand trainyard's decisions to other tools: SkyPilot tasks and Kueue objects (pure functions)."""
