"""A quote option as a SkyPilot task (``sky launch task.yaml``).

Pure: the caller passes the spec, the ranked options and where the checkpoints and data live; nothing is
read from disk or the network. The task carries trainyard's placement decision to SkyPilot:

- ``resources``: the accelerator in SkyPilot's own spelling and the count per node (SkyPilot counts a TPU
  slice as one accelerator named after the slice, ``tpu-v4-8``), ``use_spot``, cloud, region, instance
  type and a disk large enough for the checkpoints; ``any_of`` lists the runner-ups when asked.
- ``num_nodes`` from the option's allocation.
- ``file_mounts`` for the checkpoint location (SkyPilot's bucket mounts for ``s3://``/``gs://``) and the
  dataset when it is a URL.
- ``run``: writes the attempt's launch request (``envs.TRAINYARD_LAUNCH``, with the first node's IP as
  the rendezvous address) and starts one trainyard worker per device on every node, ranks node-major.
- ``envs``: the job id, the checkpoint interval the cost model chose and the expected cost.
- ``setup`` only when given: the nodes need trainyard installed (an image that has it, or a setup
  command such as ``pip install ./trainyard-*.whl``).

The field names follow SkyPilot's task schema (``sky.utils.schemas.get_task_schema``); the tests validate
exported tasks against that schema from the real ``skypilot`` package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from trainyard.catalog.names import family_of
from trainyard.catalog.offers import Offer
from trainyard.cost.quote import QuoteOption
from trainyard.errors import InvalidInputError
from trainyard.interop.launch import choose_option, launch_document, launch_env_value, worker_script
from trainyard.spec import JobSpec

# Canonical name -> SkyPilot's accelerator name, for options that do not come from a catalog offer (a
# pool of the user's own). Catalog offers carry SkyPilot's spelling already (`Offer.source_accelerator_name`,
# the catalog is SkyPilot's).
SKYPILOT_ACCELERATOR: dict[str, str] = {
    "k80": "K80",
    "p100": "P100",
    "v100": "V100",
    "t4": "T4",
    "a10g": "A10G",
    "l4": "L4",
    "a100-40gb": "A100",
    "a100-80gb": "A100-80GB",
    "h100": "H100",
    "h200": "H200",
    "trn1": "Trainium",
    "trn2": "Trainium2",
    "mi250": "MI250",
    "mi300x": "MI300X",
    "gaudi2": "Gaudi2",
}
# SkyPilot names TPU slices by TensorCores for v4 and v5p (tpu-v4-8 = 4 chips) and by chips for v5e/v6e.
_TPU_SLICE_PREFIX = {"tpu-v4": ("tpu-v4", 2), "tpu-v5p": ("tpu-v5p", 2), "tpu-v5e": ("tpu-v5litepod", 1),
                     "tpu-v6e": ("tpu-v6e", 1)}  # fmt: skip
_CLOUDS = {"aws", "gcp", "azure", "lambda", "oci", "runpod", "kubernetes", "nebius", "fluidstack"}
CHECKPOINT_MOUNT = "/trainyard/checkpoints"
DATASET_MOUNT = "/trainyard/data"
DISK_MIN_GB = 256


def _offer_for(option: QuoteOption, offers: Sequence[Offer]) -> Offer | None:
    if not option.instance_type or not option.cloud:
        return None
    for o in offers:
        if (o.cloud, o.region, o.instance_type, o.accelerator) == (
            option.cloud,
            option.region,
            option.instance_type,
            option.accelerator,
        ):
            return o
    return None


def accelerators_field(option: QuoteOption, offers: Sequence[Offer]) -> tuple[str, int]:
    """(``NAME:COUNT`` per node, number of nodes) for an option."""
    offer = _offer_for(option, offers)
    if option.accelerator == "cpu":
        raise InvalidInputError(
            "a CPU option has no accelerator to ask SkyPilot for",
            hint="Export a GPU, TPU or Trainium option (--option N), or run CPU jobs with `trainyard up`.",
        )
    if family_of(option.accelerator) == "google-tpu":
        prefix, cores_per_chip = _TPU_SLICE_PREFIX[option.accelerator]
        if offer is not None and offer.source_accelerator_name.startswith("tpu-"):
            per_node_chips = offer.devices_per_instance
            name = offer.source_accelerator_name
        else:
            per_node_chips = option.devices
            name = f"{prefix}-{option.devices * cores_per_chip}"
        nodes = max(1, math.ceil(option.devices / per_node_chips))
        return f"{name}:1", nodes
    if offer is not None and offer.source_accelerator_name:
        per_node = offer.devices_per_instance
        name = offer.source_accelerator_name
    else:
        name = SKYPILOT_ACCELERATOR[option.accelerator]
        per_node = option.devices if option.nodes <= 1 else max(1, option.devices // option.nodes)
    nodes = max(1, math.ceil(option.devices / per_node))
    return f"{name}:{min(per_node, option.devices)}", nodes


def _resources(option: QuoteOption, offers: Sequence[Offer], disk_size_gb: int) -> dict[str, Any]:
    acc, _ = accelerators_field(option, offers)
    res: dict[str, Any] = {"accelerators": acc, "use_spot": option.market == "spot"}
    if option.cloud in _CLOUDS:
        res["cloud"] = option.cloud
        res["region"] = option.region
    if option.instance_type and family_of(option.accelerator) != "google-tpu":
        res["instance_type"] = option.instance_type  # a TPU VM is named by its accelerator alone
    res["disk_size"] = disk_size_gb
    return res


def _mount(url: str, target: str) -> tuple[str, Any] | None:
    """A SkyPilot file mount for a storage URL: buckets as MOUNT-mode storage, local files copied."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme in ("s3", "gs", "r2", "az"):
        return target, {"source": url, "mode": "MOUNT"}
    if scheme == "file":
        return target, url.removeprefix("file://")
    return None


def _run_script(devices_per_node: int) -> str:
    return worker_script(
        master_addr='"$(echo "$SKYPILOT_NODE_IPS" | head -n1)"',
        node_rank="$SKYPILOT_NODE_RANK",
        devices_per_node=devices_per_node,
    )


def skypilot_task(
    spec: JobSpec,
    options: Sequence[QuoteOption],
    *,
    offers: Sequence[Offer],
    option_index: int = 1,
    any_of: int = 0,
    job_id: str | None = None,
    checkpoint_url: str | None = None,
    disk_size_gb: int | None = None,
    setup: str | None = None,
) -> dict[str, Any]:
    """The SkyPilot task for the ``option_index``-th feasible option (1 = the cheapest in the quote's
    order), with up to ``any_of`` runner-ups as alternatives SkyPilot may fall back to."""
    feasible, chosen = choose_option(spec, options, option_index)
    _, nodes = accelerators_field(chosen, offers)
    devices_per_node = max(1, chosen.devices // nodes)  # one worker per device (per chip on TPU hosts)
    job = job_id or f"sky-{spec.name}"
    ckpt = checkpoint_url or spec.checkpoint.storage or f"file://{CHECKPOINT_MOUNT}"
    disk = disk_size_gb or DISK_MIN_GB
    resources = _resources(chosen, offers, disk)
    if any_of > 0:
        alternatives = [chosen]
        for o in feasible:
            if len(alternatives) > any_of:
                break
            if o is chosen:
                continue
            if accelerators_field(o, offers)[1] == nodes:  # SkyPilot's any_of shares one num_nodes
                alternatives.append(o)
        if len(alternatives) > 1:
            resources = {"any_of": [_resources(o, offers, disk) for o in alternatives]}
    task: dict[str, Any] = {
        "name": spec.name,
        "num_nodes": nodes,
        "resources": resources,
        "envs": {
            "TRAINYARD_JOB_ID": job,
            "TRAINYARD_CHECKPOINT_INTERVAL_S": str(round(chosen.checkpoint_interval_s, 3)),
            "TRAINYARD_EXPECTED_COST_USD": f"{chosen.expected_cost_usd:.6f}",
        },
    }
    if setup:
        task["setup"] = setup
    mounts: dict[str, Any] = {}
    ckpt_mount = _mount(ckpt, CHECKPOINT_MOUNT) if not ckpt.startswith("file://") else None
    if ckpt_mount is not None:  # a bucket: every node mounts it at the same path
        mounts[ckpt_mount[0]] = ckpt_mount[1]
        ckpt_on_node = f"file://{CHECKPOINT_MOUNT}"
    else:
        ckpt_on_node = ckpt
    dataset = spec.workload.dataset
    if dataset and "://" in dataset and not dataset.startswith("ds://"):
        ds_mount = _mount(dataset, DATASET_MOUNT)
        if ds_mount is not None:
            mounts[ds_mount[0]] = ds_mount[1]
    if mounts:
        task["file_mounts"] = mounts
    launch = launch_document(spec, chosen, job_id=job, checkpoint_url=ckpt_on_node, world_size=chosen.devices)
    task["envs"]["TRAINYARD_LAUNCH"] = launch_env_value(launch)
    task["run"] = _run_script(devices_per_node)
    return task
