"""Admission: a job nothing can run is failed with the constraint that binds, found on the whole quote."""

from __future__ import annotations

from pathlib import Path

from trainyard.services.domain import JobState
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.settings import Settings
from trainyard.spec.loader import spec_from_dict


def test_budget_infeasible_job_is_told_its_budget(tmp_path: Path) -> None:
    p = Platform.open(Settings(home=tmp_path), PlatformOptions(with_catalog=True, cpu_count=1))
    try:
        admin = p.tenants.authenticate(p.settings.api_key_path.read_text().strip())
        spec = spec_from_dict(
            {
                "name": "tight",
                "model": {"n_layers": 24, "d_model": 2048, "n_heads": 16, "vocab_size": 32000},
                "workload": {"seq_len": 2048, "global_batch": 32, "steps": 20000},
                "requirements": {"allow": ["a10g"]},
                "objective": {"budget_usd": 1.0},
            }
        )
        job, _ = p.jobs.submit(admin, spec)
        p.jobs.admit_pending()
        got = p.jobs.get(admin, job.id)
        assert got.state == JobState.FAILED
        assert "objective.budget_usd" in got.reason, got.reason
        assert got.reason.index("objective.budget_usd") < got.reason.find("requirements.allow") or (
            "requirements.allow" not in got.reason
        )
    finally:
        p.close()
