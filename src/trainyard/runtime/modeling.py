"""Builds the model a JobSpec describes with Hugging Face ``transformers`` classes (no downloads).

- ``decoder`` → ``LlamaForCausalLM`` for ``ffn: gated`` (``MixtralForCausalLM`` when ``n_experts`` is
  set), ``ArceeForCausalLM`` (the same decoder with a plain up/GELU/down MLP) for ``ffn: mlp``; either way
  the parameter count equals the spec's (``trainyard spec validate``)
- ``encoder`` → ``BertForMaskedLM``
- ``encoder-decoder`` → ``T5ForConditionalGeneration`` (first half of each window in, second half out)
- ``model.base: file:///dir`` → the user's HF-format directory, loaded unchanged (its tokenizer too)

Dropout is off (modern pre-training practice) so training is a pure function of the data; LoRA wraps
the model with ``peft``. Weights are initialised from a seed derived from ``workload.seed``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch

from trainyard.runtime.determinism import derive_seed
from trainyard.spec.models import Architecture, FFNKind, JobSpec, Method, Precision


class ModelBuildError(ValueError):
    """The spec's model cannot be built by the runtime (a user error)."""


# ---- precision -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrecisionPolicy:
    """How tensors are stored and computed. Checkpoints record it; loading casts to the current one."""

    name: str
    param_dtype: str  # dtype of the parameters kept by the optimizer (the master weights)
    compute_dtype: str  # autocast dtype of forward/backward
    optimizer_state_dtype: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @property
    def torch_param_dtype(self) -> torch.dtype:
        return getattr(torch, self.param_dtype)

    @property
    def torch_compute_dtype(self) -> torch.dtype:
        return getattr(torch, self.compute_dtype)

    def autocast(self, device_type: str = "cpu") -> Any:
        """Autocast on the device the model is on (``cpu`` or ``cuda``)."""
        if self.compute_dtype == self.param_dtype:
            return torch.autocast(device_type, enabled=False)
        return torch.autocast(device_type, dtype=self.torch_compute_dtype)

    def needs_grad_scaler(self, device_type: str) -> bool:
        """fp16 autocast on CUDA needs a loss scaler (fp16 gradients underflow); bf16 and CPU do not."""
        return device_type == "cuda" and self.compute_dtype == "float16" and self.param_dtype == "float32"


POLICIES = {
    "fp32": PrecisionPolicy("fp32", "float32", "float32", "float32"),
    "bf16-mixed": PrecisionPolicy("bf16-mixed", "float32", "bfloat16", "float32"),
    "fp16-mixed": PrecisionPolicy("fp16-mixed", "float32", "float16", "float32"),
    # parameters themselves in bf16 (half the checkpoint size); produced by `trainyard checkpoint convert`
    "bf16": PrecisionPolicy("bf16", "bfloat16", "bfloat16", "bfloat16"),
}


def policy_for(precision: str | Precision) -> PrecisionPolicy:
    name = precision.value if isinstance(precision, Precision) else str(precision)
    if name not in POLICIES:
        raise ModelBuildError(
            f"workload.precision {name} is not supported by the built-in trainer (fp8 needs Transformer "
            "Engine kernels); use fp32, bf16-mixed or fp16-mixed"
        )
    return POLICIES[name]


# ---- model ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltModel:
    model: torch.nn.Module
    task: str  # "causal-lm" | "masked-lm" | "seq2seq"
    vocab_size: int
    tokenizer_path: str | None
    description: dict[str, Any]


def local_base_path(base: str) -> Path | None:
    """A ``file://`` or absolute-path base model directory, or None for registry names."""
    if base.startswith("file://"):
        return Path(base[len("file://") :])
    if base.startswith("/"):
        return Path(base)
    resolved = os.environ.get("TRAINYARD_BASE_MODEL_PATH")
    return Path(resolved) if resolved else None


def _config_from_spec(spec: JobSpec) -> tuple[Any, str]:
    m = spec.model
    seq_len = spec.workload.seq_len_eff
    assert m.n_layers and m.d_model and m.n_heads and m.vocab_size
    if m.architecture == Architecture.DECODER:
        common: dict[str, Any] = dict(
            vocab_size=m.vocab_size,
            hidden_size=m.d_model,
            intermediate_size=m.d_ff_eff,
            num_hidden_layers=m.n_layers,
            num_attention_heads=m.n_heads,
            num_key_value_heads=m.n_kv_heads_eff,
            head_dim=m.head_dim_eff,
            max_position_embeddings=max(seq_len, 16),
            tie_word_embeddings=m.tie_embeddings,
            attention_dropout=0.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
        if m.n_experts:
            if m.ffn != FFNKind.GATED:
                raise ModelBuildError(
                    "model.ffn: mlp with n_experts is not built by the runtime (its MoE experts are gated "
                    "FFNs); set model.ffn: gated"
                )
            from transformers import MixtralConfig

            return MixtralConfig(
                num_local_experts=m.n_experts, num_experts_per_tok=m.experts_per_token or 1, **common
            ), ("causal-lm")
        if m.ffn != FFNKind.GATED:
            from transformers import ArceeConfig

            return ArceeConfig(hidden_act="gelu", mlp_bias=False, **common), "causal-lm"
        from transformers import LlamaConfig

        return LlamaConfig(**common), "causal-lm"
    if m.architecture == Architecture.ENCODER:
        from transformers import BertConfig

        if m.head_dim is not None and m.head_dim * m.n_heads != m.d_model:
            raise ModelBuildError("model.head_dim must equal d_model / n_heads for an encoder")
        return BertConfig(
            vocab_size=m.vocab_size,
            hidden_size=m.d_model,
            num_hidden_layers=m.n_layers,
            num_attention_heads=m.n_heads,
            intermediate_size=m.d_ff_eff,
            max_position_embeddings=max(seq_len, 16),
            type_vocab_size=1,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            pad_token_id=0,
        ), "masked-lm"
    if m.architecture == Architecture.ENCODER_DECODER:
        from transformers import T5Config

        t5_extra: dict[str, Any] = {"decoder_start_token_id": 0, "tie_word_embeddings": m.tie_embeddings}

        return T5Config(
            vocab_size=m.vocab_size,
            d_model=m.d_model,
            d_kv=m.head_dim_eff,
            d_ff=m.d_ff_eff,
            num_layers=m.n_layers,
            num_decoder_layers=m.n_layers,
            num_heads=m.n_heads,
            dropout_rate=0.0,
            feed_forward_proj="gated-gelu" if m.ffn == FFNKind.GATED else "relu",
            pad_token_id=0,
            eos_token_id=2,
            **t5_extra,
        ), "seq2seq"
    raise ModelBuildError(
        "a custom model (params_b only) needs model.base pointing at an HF-format directory"
    )


def _load_base(path: Path) -> tuple[torch.nn.Module, str, str | None]:
    if not path.is_dir() or not (path / "config.json").exists():
        raise ModelBuildError(f"model.base {path} is not a Hugging Face model directory (no config.json)")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    archs = " ".join(getattr(cfg, "architectures", None) or [])
    if getattr(cfg, "is_encoder_decoder", False):
        model, task = AutoModelForSeq2SeqLM.from_pretrained(path, local_files_only=True), "seq2seq"
    elif "MaskedLM" in archs:
        model, task = AutoModelForMaskedLM.from_pretrained(path, local_files_only=True), "masked-lm"
    else:
        model, task = AutoModelForCausalLM.from_pretrained(path, local_files_only=True), "causal-lm"
    tok_files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt")
    tokenizer = str(path) if any((path / f).exists() for f in tok_files) else None
    return model, task, tokenizer


def lora_target_modules(model: torch.nn.Module) -> list[str]:
    names = set()
    for name, mod in model.named_modules():
        if (
            isinstance(mod, torch.nn.Linear)
            and not name.endswith(("lm_head", "decoder"))
            and "cls." not in name
        ):
            names.add(name.rsplit(".", 1)[-1])
    return sorted(names)


def build_model(spec: JobSpec) -> BuiltModel:
    seed = spec.workload.seed
    torch.manual_seed(derive_seed(seed, "init"))
    tokenizer_path: str | None = None
    if spec.model.base is not None and (base := local_base_path(spec.model.base)) is not None:
        model, task, tokenizer_path = _load_base(base)
        source = f"base:{base}"
    elif spec.model.is_custom:
        raise ModelBuildError(
            f"model.base {spec.model.base!r} is not a local directory; use file:///path/to/hf-model"
            if spec.model.base
            else "a custom model (params_b only) needs model.base pointing at an HF-format directory"
        )
    else:
        from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

        config, task = _config_from_spec(spec)
        auto = {
            "causal-lm": AutoModelForCausalLM,
            "masked-lm": AutoModelForMaskedLM,
            "seq2seq": AutoModelForSeq2SeqLM,
        }
        model = auto[task].from_config(config)
        source = f"spec:{type(config).__name__}"
    vocab = int(cast(Any, model).get_input_embeddings().weight.shape[0])
    if spec.workload.method == Method.LORA:
        from peft import LoraConfig, get_peft_model

        targets = lora_target_modules(model)
        torch.manual_seed(derive_seed(seed, "lora-init"))
        r = spec.workload.lora_rank
        model = get_peft_model(
            model, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=targets, bias="none")
        )
    model.train()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return BuiltModel(
        model=model,
        task=task,
        vocab_size=vocab,
        tokenizer_path=tokenizer_path,
        description={"source": source, "task": task, "params": total, "trainable_params": trainable},
    )


def forward_loss(built: BuiltModel, tokens: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
    """Mean loss of one micro-batch (``labels``: masked-LM targets or loss-masked causal targets, else
    derived from ``tokens``)."""
    model = built.model
    if built.task == "causal-lm":  # labels: the tokens, or masked to the answers (-100 elsewhere)
        return model(input_ids=tokens, labels=tokens if labels is None else labels).loss
    if built.task == "masked-lm":
        assert labels is not None
        return model(input_ids=tokens, labels=labels).loss
    half = max(1, tokens.shape[1] // 2)
    return model(input_ids=tokens[:, :half].contiguous(), labels=tokens[:, half:].contiguous()).loss
