"""SkyPilot and Kueue exports of a quote: the chosen option's accelerator, count, nodes, market and
region reach the exported document; pod templates load with the official kubernetes client's models."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient, V1PodTemplateSpec

from trainyard.catalog.offers import catalog_pools, load_offers, with_catalog_price
from trainyard.catalog.pools import load_pools
from trainyard.cost.quote import quote
from trainyard.errors import InvalidInputError
from trainyard.interop.kueue import kueue_manifests, label_value, object_name
from trainyard.interop.skypilot import accelerators_field, skypilot_task
from trainyard.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def lora() -> Any:
    spec = load_spec(EXAMPLES / "lora-7b.yaml")
    return spec, quote(spec, list(catalog_pools()))


@pytest.fixture(scope="module")
def seeded() -> Any:
    spec = load_spec(EXAMPLES / "lora-7b.yaml")
    pools = [with_catalog_price(p) for p in load_pools(EXAMPLES / "seed-pools.yaml")]
    return spec, quote(spec, pools), pools


def _feasible(options: Any) -> list[Any]:
    return [o for o in options if o.feasible and o.accelerator != "cpu"]


def test_skypilot_task_carries_the_chosen_option(lora: Any) -> None:
    spec, options = lora
    for n in (1, 2, 5):
        o = _feasible(options)[n - 1]
        task = skypilot_task(spec, options, offers=load_offers(), option_index=n)
        res = task["resources"]
        assert res["use_spot"] is (o.market == "spot")
        assert res["region"] == o.region and res["cloud"] == o.cloud
        name, count = res["accelerators"].split(":")
        _acc, nodes = accelerators_field(o, load_offers())
        assert task["num_nodes"] == nodes
        if o.accelerator.startswith("tpu"):
            assert name.startswith("tpu-") and count == "1"
        else:
            assert int(count) * nodes == o.devices
        launch = json.loads(task["envs"]["TRAINYARD_LAUNCH"])
        assert launch["world_size"] == o.devices
        assert launch["checkpoint_interval_s"] == o.checkpoint_interval_s
        assert float(task["envs"]["TRAINYARD_CHECKPOINT_INTERVAL_S"]) == pytest.approx(
            o.checkpoint_interval_s
        )
        assert launch["spec"]["name"] == spec.name
        assert "python -m trainyard.runtime.worker" in task["run"]


def test_skypilot_catalog_names_are_skypilots_own(seeded: Any) -> None:
    """An A100 offer from the catalog exports as SkyPilot's `A100:8` with the instance type."""
    spec, _options, _ = seeded
    offers = load_offers()
    o = next(o for o in offers if o.instance_type == "p4d.24xlarge" and o.region == "us-east-1")
    opts = quote(
        spec, [p for p in catalog_pools() if p.instance_type == "p4d.24xlarge" and p.region == "us-east-1"]
    )
    task = skypilot_task(spec, opts, offers=offers)
    assert task["resources"]["accelerators"] == f"{o.source_accelerator_name}:8"
    assert task["resources"]["instance_type"] == "p4d.24xlarge"


def test_skypilot_any_of_lists_runner_ups_with_the_same_node_count(lora: Any) -> None:
    spec, options = lora
    task = skypilot_task(spec, options, offers=load_offers(), any_of=3)
    alts = task["resources"]["any_of"]
    assert 2 <= len(alts) <= 4
    assert (
        alts[0]["accelerators"]
        == skypilot_task(spec, options, offers=load_offers())["resources"]["accelerators"]
    )
    assert len({json.dumps(a, sort_keys=True) for a in alts}) == len(alts)


def test_skypilot_bucket_storage_is_mounted(lora: Any) -> None:
    spec, options = lora
    spec = spec.model_copy(
        update={"checkpoint": spec.checkpoint.model_copy(update={"storage": "s3://bkt/ckpt"})}
    )
    task = skypilot_task(spec, options, offers=load_offers())
    assert task["file_mounts"]["/trainyard/checkpoints"] == {"source": "s3://bkt/ckpt", "mode": "MOUNT"}
    assert json.loads(task["envs"]["TRAINYARD_LAUNCH"])["checkpoint_url"] == "file:///trainyard/checkpoints"


def test_skypilot_option_out_of_range_is_a_clear_error(lora: Any) -> None:
    spec, options = lora
    with pytest.raises(InvalidInputError, match="out of range"):
        skypilot_task(spec, options, offers=load_offers(), option_index=len(_feasible(options)) + 1)


def _pod(template: dict[str, Any]) -> V1PodTemplateSpec:
    class _Response:
        data = json.dumps(template)

    return ApiClient().deserialize(_Response(), "V1PodTemplateSpec")  # type: ignore[arg-type]


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_kueue_objects_match_the_quote(seeded: Any) -> None:
    spec, options, pools = seeded
    objects = kueue_manifests(spec, options, pools, flavors=3)
    kinds = [o["kind"] for o in objects]
    assert kinds[-3:] == ["ClusterQueue", "LocalQueue", "Workload"] and set(kinds[:-3]) == {"ResourceFlavor"}
    chosen = _feasible(options)[0]
    flavors = [o for o in objects if o["kind"] == "ResourceFlavor"]
    assert flavors[0]["spec"]["nodeLabels"]["trainyard.dev/pool"] == label_value(chosen.pool)
    cq = objects[-3]
    group = cq["spec"]["resourceGroups"][0]
    assert group["coveredResources"][0] == "nvidia.com/gpu"
    assert [f["name"] for f in group["flavors"]] == [f["metadata"]["name"] for f in flavors]
    pool = next(p for p in pools if p.name == chosen.pool)
    gpu_quota = group["flavors"][0]["resources"][0]
    assert gpu_quota == {"name": "nvidia.com/gpu", "nominalQuota": pool.devices_per_node * pool.nodes}
    wl = objects[-1]
    assert wl["spec"]["queueName"] == objects[-2]["metadata"]["name"] == cq["metadata"]["name"]
    assert wl["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == cq["metadata"]["name"]
    ps = wl["spec"]["podSets"][0]
    pod = _pod(ps["template"])
    container = pod.spec.containers[0]
    per_pod = int(container.resources.limits["nvidia.com/gpu"])
    assert per_pod * ps["count"] == chosen.devices
    assert container.resources.requests["nvidia.com/gpu"] == str(per_pod)
    for o in objects:
        assert DNS_LABEL.match(o["metadata"]["name"]), o["metadata"]["name"]
        for v in o["spec"].get("nodeLabels", {}).values():
            assert re.match(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$", v)
    yaml.safe_load_all(yaml.safe_dump_all(objects))


def test_kubernetes_models_reject_a_broken_template() -> None:
    """The model check has teeth: a container without a name does not load."""
    with pytest.raises(ValueError):
        _pod({"spec": {"containers": [{"image": "x"}]}})


def test_label_and_name_sanitising() -> None:
    assert label_value("aws/us-east-1/p4d.24xlarge/spot") == "aws-us-east-1-p4d.24xlarge-spot"
    assert object_name("Ty-AWS/x_y") == "ty-aws-x-y"
    assert len(label_value("x" * 100)) == 63
