"""Tenants, API keys and quotas."""
