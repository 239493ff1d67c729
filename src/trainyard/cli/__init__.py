"""Typer commands over the client or the pure core; no business logic lives here."""
