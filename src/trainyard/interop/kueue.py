"""A quote as Kueue objects: a ``Workload`` for the job and the ``ResourceFlavor``s, ``ClusterQueue`` and
``LocalQueue`` for the pools involved.

Pure: built from the spec, the ranked quote options and their pools. Each pool becomes one
ResourceFlavor whose node labels select that pool's nodes: ``trainyard.dev/pool`` and
``trainyard.dev/accelerator`` (the label form of the Ray resources in docs/ray.md, sanitised to label
values), plus the well-known ``node.kubernetes.io/instance-type`` and ``topology.kubernetes.io/region``
when the pool has them. The ClusterQueue's nominal quotas are the pools' devices, so Kueue admits the
job where trainyard would place it; the flavors are listed cheapest option first, which is the order
Kueue tries them in.

The Workload has one pod set of one pod per node, each asking for its devices through the device
plugin's extended resource (``nvidia.com/gpu``, ``google.com/tpu``, ``aws.amazon.com/neuron``,
``amd.com/gpu``, ``habana.ai/gaudi``). The pod templates are Kubernetes ``PodTemplateSpec`` documents;
the tests load them with the official ``kubernetes`` client's models.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from trainyard.catalog.names import family_of
from trainyard.catalog.pools import Pool
from trainyard.cost.quote import QuoteOption
from trainyard.errors import InvalidInputError
from trainyard.interop.launch import choose_option, launch_document, launch_env_value, worker_script
from trainyard.spec import JobSpec

API_VERSION = "kueue.x-k8s.io/v1beta1"
DEVICE_RESOURCE = {
    "nvidia": "nvidia.com/gpu",
    "google-tpu": "google.com/tpu",
    "aws-trainium": "aws.amazon.com/neuron",
    "amd": "amd.com/gpu",
    "intel-gaudi": "habana.ai/gaudi",
}
POOL_LABEL = "trainyard.dev/pool"
ACCELERATOR_LABEL = "trainyard.dev/accelerator"
MARKET_LABEL = "trainyard.dev/market"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
CHECKPOINT_URL = "file:///trainyard/checkpoints"  # a volume the cluster mounts, when the spec names none
CPU_PER_DEVICE = 4  # host CPU and memory requested per device (and quota per pool device)
MEMORY_GIB_PER_DEVICE = 16
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")
_NAME = re.compile(r"[^a-z0-9-]+")


def label_value(s: str) -> str:
    """A Kubernetes label value (≤ 63 characters of [A-Za-z0-9._-], alphanumeric at both ends)."""
    v = _LABEL_VALUE.sub("-", s)[:63].strip("-._")
    return v or "x"


def object_name(s: str) -> str:
    """A DNS-1123 label (lower case, digits and '-', ≤ 63)."""
    v = _NAME.sub("-", s.lower())[:63].strip("-")
    return v or "x"


def _device_resource(accelerator: str) -> str:
    family = family_of(accelerator)
    if family not in DEVICE_RESOURCE:
        raise InvalidInputError(
            f"{accelerator} has no Kubernetes device resource",
            hint="Export an accelerator option (NVIDIA, TPU, Trainium, AMD or Gaudi), not a CPU one.",
        )
    return DEVICE_RESOURCE[family]


def _flavor_name(pool: str) -> str:
    return object_name(f"ty-{pool}")


def resource_flavor(pool: Pool) -> dict[str, Any]:
    labels = {
        POOL_LABEL: label_value(pool.name),
        ACCELERATOR_LABEL: label_value(pool.accelerator),
        MARKET_LABEL: label_value(pool.market.value),
    }
    if pool.instance_type:
        labels["node.kubernetes.io/instance-type"] = label_value(pool.instance_type)
    if pool.region:
        labels["topology.kubernetes.io/region"] = label_value(pool.region)
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": _flavor_name(pool.name)},
        "spec": {"nodeLabels": labels},
    }


def _pod_template(
    resource: str, per_pod: int, image: str, job: str, launch: dict[str, Any]
) -> dict[str, Any]:
    """One pod per node: the pod's index (an Indexed Job's completion index) is the node rank, and pod 0
    of the job's headless service (``<name>-0.<name>``) is the rendezvous address."""
    name = object_name(job)
    script = worker_script(master_addr=f"{name}-0.{name}", node_rank="$POD_INDEX", devices_per_node=per_pod)
    requests = {
        resource: str(per_pod),
        "cpu": str(CPU_PER_DEVICE * per_pod),
        "memory": f"{MEMORY_GIB_PER_DEVICE * per_pod}Gi",
    }
    index_ref = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    return {
        "metadata": {
            "labels": {"app.kubernetes.io/name": "trainyard-worker", "trainyard.dev/job": label_value(job)}
        },
        "spec": {
            "restartPolicy": "Never",
            "subdomain": name,
            "containers": [
                {
                    "name": "worker",
                    "image": image,
                    "command": ["/bin/sh", "-c", script],
                    "env": [
                        {"name": "TRAINYARD_LAUNCH", "value": launch_env_value(launch)},
                        {"name": "POD_INDEX", "valueFrom": {"fieldRef": {"fieldPath": index_ref}}},
                    ],
                    "resources": {"requests": requests, "limits": {resource: str(per_pod)}},
                }
            ],
        },
    }


def kueue_manifests(
    spec: JobSpec,
    options: Sequence[QuoteOption],
    pools: Sequence[Pool],
    *,
    option_index: int = 1,
    flavors: int = 4,
    job_id: str | None = None,
    namespace: str = "default",
    image: str = "trainyard-worker:latest",
) -> list[dict[str, Any]]:
    """[ResourceFlavor..., ClusterQueue, LocalQueue, Workload] for the job's chosen option and up to
    ``flavors - 1`` runner-ups on the same kind of device resource."""
    feasible, chosen = choose_option(spec, options, option_index)
    by_name = {p.name: p for p in pools}
    resource = _device_resource(chosen.accelerator)
    picked: list[QuoteOption] = [chosen]
    for o in feasible:
        if len(picked) >= flavors:
            break
        if (
            o.pool != chosen.pool
            and o.pool not in {p.pool for p in picked}
            and (_device_resource(o.accelerator) == resource and o.devices == chosen.devices)
        ):
            picked.append(o)
    missing = [o.pool for o in picked if o.pool not in by_name]
    if missing:
        raise InvalidInputError(f"pool {missing[0]!r} of the quote is not among the pools given")
    job = job_id or spec.name
    pool = by_name[chosen.pool]
    per_pod = min(pool.devices_per_node, chosen.devices)
    pods = max(1, math.ceil(chosen.devices / per_pod))
    launch = launch_document(
        spec,
        chosen,
        job_id=job,
        checkpoint_url=spec.checkpoint.storage or CHECKPOINT_URL,
        world_size=chosen.devices,
    )
    objects: list[dict[str, Any]] = [resource_flavor(by_name[o.pool]) for o in picked]
    queue = object_name(f"trainyard-{spec.name}")
    objects.append(
        {
            "apiVersion": API_VERSION,
            "kind": "ClusterQueue",
            "metadata": {"name": queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": [resource, "cpu", "memory"],
                        "flavors": [_flavor_quota(by_name[o.pool], resource) for o in picked],
                    }
                ],
            },
        }
    )
    objects.append(
        {
            "apiVersion": API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": queue, "namespace": namespace},
            "spec": {"clusterQueue": queue},
        }
    )
    objects.append(
        {
            "apiVersion": API_VERSION,
            "kind": "Workload",
            "metadata": {
                "name": object_name(job),
                "namespace": namespace,
                "labels": {QUEUE_LABEL: queue},
                "annotations": {
                    "trainyard.dev/expected-cost-usd": f"{chosen.expected_cost_usd:.6f}",
                    "trainyard.dev/checkpoint-interval-s": f"{chosen.checkpoint_interval_s:.0f}",
                    "trainyard.dev/pool": chosen.pool,
                },
            },
            "spec": {
                "queueName": queue,
                "podSets": [
                    {
                        "name": "workers",
                        "count": pods,
                        "template": _pod_template(resource, per_pod, image, job, launch),
                    }
                ],
            },
        }
    )
    return objects


def _flavor_quota(pool: Pool, resource: str) -> dict[str, Any]:
    """A pool's devices as the flavor's nominal quota, with the host CPU and memory that go with them."""
    devices = _available(pool)
    return {
        "name": _flavor_name(pool.name),
        "resources": [
            {"name": resource, "nominalQuota": devices},
            {"name": "cpu", "nominalQuota": devices * CPU_PER_DEVICE},
            {"name": "memory", "nominalQuota": f"{devices * MEMORY_GIB_PER_DEVICE}Gi"},
        ],
    }


def _available(pool: Pool) -> int:
    total = pool.devices_per_node * pool.nodes
    return total if pool.available_devices is None else min(total, pool.available_devices)
