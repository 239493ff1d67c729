"""The REST API (FastAPI): app factory, routers per resource, auth, error rendering."""
