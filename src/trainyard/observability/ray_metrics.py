"""The Ray cluster's state on the API server's ``/metrics``, which answers an admin key or
``TRAINYARD_METRICS_TOKEN`` only.

Ray's own Prometheus exporters (each node's metrics export port, the head's autoscaler and dashboard
metrics servers) answer anyone who connects, and a sandboxed gang shares its nodes' network, so the
clusters trainyard starts run none of them (``executors.ray_cluster.NO_EXPORTERS_ENV``; docs/ray.md
for operators' clusters). What an operator needs from the cluster is read on each scrape through the
server's authenticated driver connection (:meth:`RayExecutor.cluster_state`) and exported here:

- ``trainyard_ray_cluster_up``: 1 when the cluster's state could be read on this scrape;
- ``trainyard_ray_nodes{state}``: nodes the GCS lists as ``alive`` or ``dead``;
- ``trainyard_ray_node_resource{node_id, ip, resource}``: each alive node's total of a resource (CPU,
  GPU, memory and object store bytes, ``trainyard/pool:<name>`` units, ...);
- ``trainyard_ray_resource_total{resource}`` / ``trainyard_ray_resource_available{resource}``: the
  alive nodes' sum and what is free of it now.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = structlog.get_logger("trainyard.metrics")


class RayClusterCollector(Collector):
    """Gauges read from the Ray cluster on every scrape (``executor.cluster_state()``)."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor

    def describe(self) -> list[Any]:
        return []  # collected lazily; nothing is read at registration time

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("trainyard_ray_cluster_up", "1 when the Ray cluster's state was read")
        try:
            state = self.executor.cluster_state()
        except Exception as exc:  # a scrape must not fail because the cluster is away
            log.warning("ray_cluster_metrics_unavailable", error=str(exc))
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        nodes = GaugeMetricFamily("trainyard_ray_nodes", "Ray nodes by state", labels=["state"])
        alive = [n for n in state["nodes"] if n["alive"]]
        nodes.add_metric(["alive"], len(alive))
        nodes.add_metric(["dead"], len(state["nodes"]) - len(alive))
        yield nodes
        per_node = GaugeMetricFamily(
            "trainyard_ray_node_resource",
            "Total of a resource on an alive Ray node",
            labels=["node_id", "ip", "resource"],
        )
        total: dict[str, float] = {}
        for n in alive:
            for resource, amount in sorted(n["resources"].items()):
                if resource.startswith("node:"):
                    continue  # Ray's per-node marker resource, one unit per node
                per_node.add_metric([n["node_id"], n["ip"], resource], amount)
                total[resource] = total.get(resource, 0.0) + amount
        yield per_node
        totals = GaugeMetricFamily(
            "trainyard_ray_resource_total", "A resource summed over the alive Ray nodes", labels=["resource"]
        )
        free = GaugeMetricFamily(
            "trainyard_ray_resource_available", "What is free of a resource now", labels=["resource"]
        )
        for resource, amount in sorted(total.items()):
            totals.add_metric([resource], amount)
            free.add_metric([resource], state["available"].get(resource, 0.0))
        yield totals
        yield free
