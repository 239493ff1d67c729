from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.errors import SpecError
from trainyard.spec import load_spec, load_spec_text, parse_duration_s, spec_from_dict

BASE = {
    "name": "t",
    "model": {"n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 100},
    "workload": {"seq_len": 16, "global_batch": 4, "steps": 10},
}


def with_(path: str, value: object) -> dict:
    import copy

    doc = copy.deepcopy(BASE)
    cur = doc
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
    cur[keys[-1]] = value
    return doc


def test_seed_example_loads(examples_dir):
    spec = load_spec(examples_dir / "seed-example.yaml")
    assert spec.name == "seed-example"
    assert spec.measured.step_time_s == {"a100-40gb": 0.8, "trn1": 1.1, "tpu-v4": 0.5}
    assert spec.total_steps == 20000


def test_llama2_7b_param_count():
    spec = spec_from_dict(
        {
            "name": "llama2-7b",
            "model": {
                "n_layers": 32,
                "d_model": 4096,
                "n_heads": 32,
                "d_ff": 11008,
                "ffn": "gated",
                "vocab_size": 32000,
            },
            "workload": {"seq_len": 4096, "global_batch": 1024, "tokens": 2e12},
        }
    )
    # Llama-2-7B has 6,738,415,616 parameters (HF config); ours counts RMSNorm weights too.
    assert spec.params == 6_738_415_616
    assert spec.total_steps == -(-2_000_000_000_000 // (4096 * 1024))


def test_gqa_reduces_params():
    mha = spec_from_dict(with_("model.n_kv_heads", 4))
    gqa = spec_from_dict(with_("model.n_kv_heads", 1))
    assert gqa.params < mha.params
    # K and V shrink from 64x64 to 64x16 each, per layer.
    assert mha.params - gqa.params == 2 * 2 * 64 * (64 - 16)


def test_moe_active_params():
    doc = with_("model.n_experts", 8)
    doc["model"]["experts_per_token"] = 2
    spec = spec_from_dict(doc)
    assert spec.model.active_params < spec.params


def test_lora_trainable_is_small():
    doc = with_("workload.method", "lora")
    doc["workload"]["lora_rank"] = 2
    spec = spec_from_dict(doc)
    # rank·(d_in + d_out) per adapted matrix: 4 attention + 2 MLP matrices per layer.
    assert spec.trainable_params == 2 * (2 * (4 * (64 + 64)) + 2 * 2 * (64 + 256))
    assert spec.trainable_params < spec.params / 5


def test_custom_params():
    spec = spec_from_dict({**BASE, "model": {"architecture": "custom", "params_b": 7}})
    assert spec.params == 7_000_000_000


@pytest.mark.parametrize(
    ("doc", "field", "fragment"),
    [
        (with_("workload.precision", "bf17"), "workload.precision", "'bf17' is not one of fp32, bf16-mixed"),
        (with_("workload.seq_len", 0), "workload.seq_len", "greater than or equal to 1"),
        (with_("model.surprise", 1), "model.surprise", "unknown key"),
        ({**BASE, "model": {"architecture": "custom", "params_b": 1e21}}, "model.params_b", "less than"),
        (with_("requirements.allow", ["h900"]), "requirements.allow", "not an accelerator name"),
        (with_("objective.deadline", "tomorrow"), "objective.deadline", "neither a duration"),
        (with_("workload.tokens", 5), "workload", "only one of steps, tokens"),
        (with_("model.n_kv_heads", 3), "model", "multiple of n_kv_heads"),
    ],
)
def test_errors_name_field(doc, field, fragment):
    with pytest.raises(SpecError) as exc:
        spec_from_dict(doc)
    assert exc.value.message.startswith(field), exc.value.message
    assert fragment in exc.value.message


def test_malformed_yaml_one_line():
    with pytest.raises(SpecError) as exc:
        load_spec_text("name: [unclosed\n", "bad.yaml")
    assert "malformed YAML" in exc.value.message
    assert "\n" not in exc.value.message


def test_accelerator_aliases_canonicalised():
    spec = spec_from_dict(with_("requirements.allow", ["A100", "nvidia", "Trainium"]))
    assert spec.requirements.allow == ["a100-40gb", "nvidia", "trn1"]


@pytest.mark.parametrize(
    ("text", "seconds"), [("36h", 129600), ("90m", 5400), ("1h30m", 5400), ("2d", 172800), (45, 45)]
)
def test_durations(text, seconds):
    assert parse_duration_s(text) == seconds


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=12,
    )
)
def test_parser_never_crashes_on_junk(junk):
    """Arbitrary documents either parse or raise SpecError, never anything else."""
    try:
        spec_from_dict(junk)
    except SpecError as exc:
        assert exc.message


@settings(max_examples=200, deadline=None)
@given(
    section=st.sampled_from(["model", "workload"]),
    key=st.sampled_from(["n_layers", "d_model", "seq_len", "global_batch", "steps"]),
    value=st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=4), st.none()),
)
def test_field_mutations_give_spec_errors(section, key, value):
    doc = with_(f"{section}.{key}", value)
    try:
        spec = spec_from_dict(doc)
    except SpecError:
        return
    assert spec.params > 0 and spec.total_steps >= 1


# ---- seq_len: required for transformers, optional for architecture: custom ---------------------------

CUSTOM = {
    "name": "resnet",
    "model": {"architecture": "custom", "params_b": 0.025},
    "workload": {"global_batch": 256, "steps": 100},
}


def test_custom_model_needs_no_seq_len() -> None:
    spec = spec_from_dict(CUSTOM)
    assert spec.workload.seq_len is None
    assert spec.workload.seq_len_eff == 1
    assert spec.tokens_per_step == 256  # one sample is the unit of work
    doc = spec.to_document()
    assert "seq_len" not in doc["workload"]
    assert spec_from_dict(doc) == spec


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_transformer_without_seq_len_names_the_field(arch: str) -> None:
    doc = with_("model.architecture", arch)
    del doc["workload"]["seq_len"]
    with pytest.raises(SpecError) as exc:
        spec_from_dict(doc)
    errors = exc.value.details["errors"]
    assert [e["field"] for e in errors] == ["workload.seq_len"]
    assert "required" in errors[0]["message"] and arch in errors[0]["message"]
    assert str(exc.value).startswith("workload.seq_len: required")


def test_custom_tokens_count_samples_without_seq_len() -> None:
    doc = {**CUSTOM, "workload": {"global_batch": 100, "tokens": 1_000}}
    assert spec_from_dict(doc).total_steps == 10


def test_every_validation_error_is_named_in_the_message() -> None:
    """The one-line message names every error (CLI, API and dashboard show it), not the first and a count."""
    from trainyard.errors import MAX_LISTED_ERRORS, SpecError, list_errors

    bad = {
        "name": "t",
        "model": {"architecture": "decoder", "n_layers": -1, "d_model": 0, "n_heads": 4},
        "workload": {"seq_len": 0, "global_batch": 8, "steps": -5},
    }
    with pytest.raises(SpecError) as info:
        spec_from_dict(bad)
    errors = info.value.details["errors"]
    assert len(errors) >= 4
    for e in errors:
        assert f"{e['field']}: {e['message']}" in info.value.message
    assert "more)" not in info.value.message
    many = [{"field": f"f{i}", "message": "bad"} for i in range(MAX_LISTED_ERRORS + 3)]
    text = list_errors(many)
    assert text.count("bad") == MAX_LISTED_ERRORS and text.endswith("3 further errors are in details.errors")
