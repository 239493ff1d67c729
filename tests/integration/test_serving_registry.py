"""Deployments resolve model versions through the model registry: a deployment of an alias follows it
when the alias moves (no replica needed to see it: the deployment scales to zero)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.tiny_models import build_tiny_llama

from trainyard.errors import NotFoundError
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.serving.autoscale import AutoscalingPolicy
from trainyard.settings import Settings


def test_alias_deployment_moves_with_the_registry_alias(tmp_path: Path) -> None:
    platform = Platform.open(
        Settings(home=tmp_path / "home", database_url=f"sqlite:///{tmp_path / 'ty.db'}"),
        PlatformOptions(cpu_count=2, with_catalog=False),
    )
    try:
        base = build_tiny_llama(tmp_path / "base")
        tenant, key = platform.tenants.create("team")
        principal = platform.tenants.authenticate(key)
        v1 = platform.registry.import_directory(principal, base, "tiny")
        v2 = platform.registry.import_directory(principal, build_tiny_llama(tmp_path / "b2", seed=3), "tiny")
        platform.registry.promote(principal, v1.id, "staging")
        svc = platform.serving
        svc.create(tenant.id, tenant.name, "chat", "tiny@staging", policy=AutoscalingPolicy(min_replicas=0))
        row = svc.get(tenant.id, "chat")
        assert row.resolved == {"tiny@staging": "tiny@1"} and row.state == "ready"
        view = svc.lookup(tenant.id, "chat")
        assert view is not None and view.routes[0].resolved.path == v1.artefacts["weights"]

        platform.registry.promote(principal, v2.id, "staging")
        svc._resolve_cache.clear()  # the controller re-resolves once a second; do it now
        svc.tick()
        row = svc.get(tenant.id, "chat")
        assert row.resolved == {"tiny@staging": "tiny@2"}
        moved = [e for e in svc.events(row.id) if e.kind == "model_moved"]
        assert moved and moved[-1].data == {"ref": "tiny@staging", "from": "tiny@1", "to": "tiny@2"}

        other, _ = platform.tenants.create("other")
        with pytest.raises(NotFoundError):  # another tenant's version is invisible
            svc.create(other.id, other.name, "steal", "tiny@1", policy=AutoscalingPolicy(min_replicas=0))
    finally:
        platform.close()


def test_registered_version_resolves_to_its_weights_directory(tmp_path: Path) -> None:
    from trainyard.serving.models import RegistryModelSource

    platform = Platform.open(
        Settings(home=tmp_path / "home", database_url=f"sqlite:///{tmp_path / 'ty.db'}"),
        PlatformOptions(cpu_count=2, with_catalog=False),
    )
    try:
        base = build_tiny_llama(tmp_path / "base")
        tenant, key = platform.tenants.create("team")
        principal = platform.tenants.authenticate(key)
        platform.registry.import_directory(principal, base, "tiny")
        src = RegistryModelSource(platform.registry, lambda name: tenant.id if name == "team" else None)
        res = src.resolve("team", "tiny@1")
        assert res.version_id == "tiny@1" and res.adapter_path is None and res.base_ref is None
        assert Path(res.path, "config.json").is_file()
        with pytest.raises(NotFoundError):
            src.resolve("nobody", "tiny@1")
    finally:
        platform.close()
