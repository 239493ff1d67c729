"""What an exported task runs on its nodes: the worker's launch request and the per-node start script.

The launch request is the executor↔runtime contract (``executors.base.LaunchRequest``) for attempt 1;
it travels in the ``TRAINYARD_LAUNCH`` environment variable, and the script writes it into the run
directory with the rendezvous address filled in, then starts one worker per device (ranks node-major).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trainyard.cost.quote import QuoteOption
from trainyard.errors import InvalidInputError
from trainyard.spec import JobSpec

RUN_DIR = "~/trainyard-run"


def exportable(options: Sequence[QuoteOption]) -> list[QuoteOption]:
    """The feasible options that ask for an accelerator, in the quote's order (what `--option N` counts)."""
    return [o for o in options if o.feasible and o.accelerator != "cpu"]


def choose_option(
    spec: JobSpec, options: Sequence[QuoteOption], option_index: int
) -> tuple[list[QuoteOption], QuoteOption]:
    """(the exportable options, the ``option_index``-th of them), or a clear error."""
    feasible = exportable(options)
    if not feasible:
        raise InvalidInputError(
            f"job {spec.name!r} has no feasible accelerator option to export",
            hint="Run `trainyard quote SPEC` to see why each option was dropped.",
        )
    if not 1 <= option_index <= len(feasible):
        raise InvalidInputError(
            f"--option {option_index} is out of range: the quote has {len(feasible)} feasible "
            "accelerator options",
            hint=f"Choose 1..{len(feasible)}; `trainyard quote SPEC` numbers them in the same order.",
        )
    return feasible, feasible[option_index - 1]


def launch_document(
    spec: JobSpec, option: QuoteOption, *, job_id: str, checkpoint_url: str, world_size: int
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "attempt": 1,
        "spec": spec.to_document(),
        "world_size": world_size,
        "pool": option.pool or f"{option.cloud}/{option.region}/{option.instance_type}/{option.market}",
        "market": option.market,
        "checkpoint_url": checkpoint_url,
        "checkpoint_interval_s": option.checkpoint_interval_s,
        "run_dir": RUN_DIR,
        "notice_s": option.notice_s or 30.0,
        "env": {},
    }


def launch_env_value(launch: dict[str, Any]) -> str:
    return json.dumps(launch, sort_keys=True, separators=(",", ":"))


def worker_script(*, master_addr: str, node_rank: str, devices_per_node: int, run_dir: str = RUN_DIR) -> str:
    """A POSIX shell script; ``master_addr`` and ``node_rank`` are shell expressions."""
    write_launch = (
        'python -c \'import json, os; d = json.loads(os.environ["TRAINYARD_LAUNCH"]); '
        'd["env"]["MASTER_ADDR"] = os.environ["MASTER_ADDR"]; '
        f'd["run_dir"] = os.path.expanduser("{run_dir}"); '
        'open(os.path.join(d["run_dir"], "launch-a1.json"), "w").write(json.dumps(d))\''
    )
    return "\n".join(
        [
            "set -eu",
            f"mkdir -p {run_dir}",
            f"export MASTER_ADDR={master_addr}",
            write_launch,
            f"PER_NODE={devices_per_node}",
            "LOCAL=0",
            'while [ "$LOCAL" -lt "$PER_NODE" ]; do',
            f"  RANK=$(( {node_rank} * PER_NODE + LOCAL ))",
            f"  python -m trainyard.runtime.worker --run-dir {run_dir} --attempt 1 --rank $RANK &",
            "  LOCAL=$((LOCAL + 1))",
            "done",
            "wait",
            "",
        ]
    )
