"""The documented job spec example is valid and quotable (README "Job spec" and docs/spec.md)."""

from __future__ import annotations

import re
from pathlib import Path

from trainyard.cost.quote import quote
from trainyard.spec import load_spec_text

ROOT = Path(__file__).resolve().parents[2]


def _example(path: Path, after: str = "") -> str:
    text = path.read_text(encoding="utf-8")
    if after:
        text = text[text.index(after) :]
    m = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert m, f"no yaml example in {path}"
    return m.group(1)


def test_readme_job_spec_example_is_valid_and_quotable() -> None:
    readme = _example(ROOT / "README.md", "## Job spec")
    assert readme == _example(ROOT / "docs" / "spec.md")
    spec = load_spec_text(readme, "README.md")
    assert spec.workload.method.value == "lora" and spec.objective.budget_usd == 500
    options = quote(spec)
    feasible = [o for o in options if o.feasible]
    assert feasible, "the documented example must have a feasible option"
    assert all(o.accelerator != "k80" for o in feasible)  # denied
    assert all(o.region.startswith(("us-", "europe-")) for o in feasible)
    reasons = " ".join(o.reason for o in options if not o.feasible)
    assert "requirements.deny" in reasons and "min_memory_per_device_gib" in reasons
