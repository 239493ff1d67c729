"""The device-agnostic workload contract (DESIGN §3.2).

A JobSpec describes *what* to train and the constraints on it, never *which chip*. Unknown keys are
errors; every error names its field path. Derived quantities (parameter counts, tokens per step,
total steps) carry their units in their names.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from trainyard.enums import Market

API_VERSION: Final = "trainyard/v1"
KIND: Final = "TrainingJob"

# Absurd-value guards: far beyond anything trainable, small enough to keep float math finite.
MAX_PARAMS_B = 100_000.0  # 100 trillion parameters
MAX_DIM = 1_048_576
MAX_LAYERS = 10_000
MAX_SEQ_LEN = 16_777_216
MAX_BATCH = 16_777_216
MAX_STEPS = 10**10
MAX_TOKENS = 10**16
MAX_DEVICES = 1_000_000
# Positive quantities start here, not at any float above 0: subnormals like 5e-324 overflow the math
# that divides by them. One millionth of the unit (a dollar, an hour, a GiB, a second) is below any use.
MIN_POSITIVE = 1e-6
MIN_DURATION_S = 1e-3


class Architecture(StrEnum):
    DECODER = "decoder"
    ENCODER = "encoder"
    ENCODER_DECODER = "encoder-decoder"
    CUSTOM = "custom"


class FFNKind(StrEnum):
    MLP = "mlp"
    GATED = "gated"


class Method(StrEnum):
    FULL = "full"
    LORA = "lora"


class Precision(StrEnum):
    FP32 = "fp32"
    BF16_MIXED = "bf16-mixed"
    FP16_MIXED = "fp16-mixed"
    FP8_MIXED = "fp8-mixed"


class Optimizer(StrEnum):
    ADAMW = "adamw"
    SGD = "sgd"
    ADAFACTOR = "adafactor"


class ActivationCheckpointing(StrEnum):
    AUTO = "auto"
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Minimize(StrEnum):
    COST = "cost"
    TIME = "time"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False, populate_by_name=True)


PosInt = Annotated[int, Field(ge=1)]


class ModelSpec(_Strict):
    """Model architecture, or just ``params_b`` for a custom model."""

    architecture: Architecture = Architecture.DECODER
    n_layers: Annotated[int, Field(ge=1, le=MAX_LAYERS)] | None = None
    d_model: Annotated[int, Field(ge=1, le=MAX_DIM)] | None = None
    n_heads: Annotated[int, Field(ge=1, le=MAX_DIM)] | None = None
    n_kv_heads: Annotated[int, Field(ge=1, le=MAX_DIM)] | None = None
    head_dim: Annotated[int, Field(ge=1, le=MAX_DIM)] | None = None
    d_ff: Annotated[int, Field(ge=1, le=16 * MAX_DIM)] | None = None
    ffn: FFNKind = FFNKind.MLP
    vocab_size: Annotated[int, Field(ge=1, le=16 * MAX_DIM)] | None = None
    n_experts: Annotated[int, Field(ge=1, le=4096)] | None = None
    experts_per_token: Annotated[int, Field(ge=1, le=4096)] | None = None
    tie_embeddings: bool = False
    params_b: Annotated[float, Field(ge=MIN_POSITIVE, le=MAX_PARAMS_B)] | None = None
    base: str | None = None

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        if self.architecture == Architecture.CUSTOM:
            if self.params_b is None:
                raise ValueError("a custom model needs params_b (parameters in billions)")
            return self
        missing = [f for f in ("n_layers", "d_model", "n_heads", "vocab_size") if getattr(self, f) is None]
        if len(missing) == 4 and self.params_b is None and self.base is not None:
            return self  # the shape comes from the registered base model at submission
        if missing and self.params_b is None:
            raise ValueError(
                f"{self.architecture.value} model needs {', '.join(missing)} "
                "(or set architecture: custom with params_b)"
            )
        if missing:
            raise ValueError(
                f"give all of n_layers, d_model, n_heads, vocab_size, or none; missing {missing}"
            )
        assert self.d_model is not None and self.n_heads is not None
        if self.head_dim is None and self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}; set head_dim explicitly"
            )
        if self.n_kv_heads is not None:
            if self.n_kv_heads > self.n_heads:
                raise ValueError(f"n_kv_heads {self.n_kv_heads} exceeds n_heads {self.n_heads}")
            if self.n_heads % self.n_kv_heads != 0:
                raise ValueError(f"n_heads {self.n_heads} must be a multiple of n_kv_heads {self.n_kv_heads}")
        if (self.n_experts is None) != (self.experts_per_token is None):
            raise ValueError("n_experts and experts_per_token go together (MoE); give both or neither")
        if (
            self.n_experts is not None
            and self.experts_per_token is not None
            and self.experts_per_token > self.n_experts
        ):
            raise ValueError(f"experts_per_token {self.experts_per_token} exceeds n_experts {self.n_experts}")
        if self.params_b is not None:
            raise ValueError(
                "params_b is only for architecture: custom; the architecture fields define the size"
            )
        return self

    # ---- derived shape -------------------------------------------------------------------------
    @property
    def needs_base_shape(self) -> bool:
        """True until the submission fills the shape in from ``base`` (a spec naming only a base)."""
        return not self.is_custom and self.n_layers is None and self.params_b is None

    @property
    def is_custom(self) -> bool:
        return self.architecture == Architecture.CUSTOM

    @property
    def head_dim_eff(self) -> int:
        if self.head_dim is not None:
            return self.head_dim
        assert self.d_model is not None and self.n_heads is not None
        return self.d_model // self.n_heads

    @property
    def n_kv_heads_eff(self) -> int:
        assert self.n_heads is not None
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def d_ff_eff(self) -> int:
        """FFN hidden size; defaults: 4·d for an MLP, 8/3·d rounded up to a multiple of 256 when gated."""
        if self.d_ff is not None:
            return self.d_ff
        assert self.d_model is not None
        if self.ffn == FFNKind.GATED:
            return int(math.ceil(8 * self.d_model / 3 / 256) * 256)
        return 4 * self.d_model

    @property
    def n_blocks(self) -> int:
        """Transformer blocks in total (an encoder-decoder counts n_layers in each stack)."""
        if self.is_custom:
            raise ValueError("a custom model has no block structure")
        assert self.n_layers is not None
        return 2 * self.n_layers if self.architecture == Architecture.ENCODER_DECODER else self.n_layers

    def attention_params(self) -> int:
        """Q, K, V and output projections of one self-attention block (GQA aware, no biases)."""
        assert self.d_model is not None and self.n_heads is not None
        q_dim = self.n_heads * self.head_dim_eff
        kv_dim = self.n_kv_heads_eff * self.head_dim_eff
        return self.d_model * q_dim + 2 * self.d_model * kv_dim + q_dim * self.d_model

    def ffn_params_per_expert(self) -> int:
        assert self.d_model is not None
        mats = 3 if self.ffn == FFNKind.GATED else 2
        return mats * self.d_model * self.d_ff_eff

    def block_params(self, active_only: bool = False) -> int:
        """Parameters of one transformer block (attention + FFN or MoE + norms)."""
        assert self.d_model is not None
        experts = 1
        router = 0
        if self.n_experts is not None and self.experts_per_token is not None:
            experts = self.experts_per_token if active_only else self.n_experts
            router = self.d_model * self.n_experts
        return self.attention_params() + experts * self.ffn_params_per_expert() + router + 2 * self.d_model

    def embedding_params(self) -> int:
        """Input embedding plus (untied) output head."""
        assert self.vocab_size is not None and self.d_model is not None
        emb = self.vocab_size * self.d_model
        head = 0 if self.tie_embeddings or self.architecture == Architecture.ENCODER else emb
        return emb + head

    def param_count(self, active_only: bool = False) -> int:
        """Total parameters (``active_only``: those used per token, for MoE)."""
        if self.is_custom:
            assert self.params_b is not None
            return round(self.params_b * 1e9)
        assert self.d_model is not None and self.n_layers is not None
        blocks = self.n_blocks * self.block_params(active_only)
        if self.architecture == Architecture.ENCODER_DECODER:
            blocks += self.n_layers * (self.attention_params() + self.d_model)  # decoder cross-attention
        final_norms = self.d_model * (2 if self.architecture == Architecture.ENCODER_DECODER else 1)
        return blocks + self.embedding_params() + final_norms

    @property
    def params(self) -> int:
        return self.param_count()

    @property
    def active_params(self) -> int:
        return self.param_count(active_only=True)


class ParallelismPin(_Strict):
    fsdp: bool = False
    tensor: Annotated[int, Field(ge=1, le=1024)] = 1
    pipeline: Annotated[int, Field(ge=1, le=1024)] = 1
    # Expert parallel degree of an MoE model (experts split over this many data-parallel ranks); left out,
    # the planner chooses it. Additive to the DESIGN §3.2 pin; meaningless (and rejected) without experts.
    expert: Annotated[int, Field(ge=1, le=4096)] | None = None


class WorkloadSpec(_Strict):
    method: Method = Method.FULL
    lora_rank: Annotated[int, Field(ge=1, le=65536)] = 16
    precision: Precision = Precision.BF16_MIXED
    optimizer: Optimizer = Optimizer.ADAMW
    # required for transformer architectures; optional for ``architecture: custom`` (not every model is
    # a sequence model: CNNs, recommenders, RL), whose "token" is then one sample (see ``seq_len_eff``)
    seq_len: Annotated[int, Field(ge=1, le=MAX_SEQ_LEN)] | None = None
    global_batch: Annotated[int, Field(ge=1, le=MAX_BATCH)]
    steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] | None = None
    tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    epochs: Annotated[float, Field(ge=MIN_POSITIVE, le=1e6)] | None = None
    dataset: str | None = None
    dataset_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    micro_batch: Annotated[int, Field(ge=1, le=MAX_BATCH)] | None = None
    activation_checkpointing: ActivationCheckpointing = ActivationCheckpointing.AUTO
    parallelism: Literal["auto"] | ParallelismPin = "auto"
    learning_rate: Annotated[float, Field(ge=1e-12, le=10)] = 3e-4

    @field_validator("tokens", "steps", mode="before")
    @classmethod
    def _accept_float_counts(cls, v: Any) -> Any:
        # YAML users write 1e9 for a billion tokens; accept integral floats.
        if isinstance(v, float) and v.is_integer():
            return int(v)
        return v

    @model_validator(mode="after")
    def _check_length(self) -> WorkloadSpec:
        given = [n for n in ("steps", "tokens", "epochs") if getattr(self, n) is not None]
        if not given:
            raise ValueError("give the training length as one of steps, tokens or epochs")
        if len(given) > 1:
            raise ValueError(f"give only one of steps, tokens, epochs (got {', '.join(given)})")
        if self.micro_batch is not None and self.micro_batch > self.global_batch:
            raise ValueError(f"micro_batch {self.micro_batch} exceeds global_batch {self.global_batch}")
        return self

    @property
    def seq_len_eff(self) -> int:
        """The sequence length the workload maths uses: ``seq_len``, or 1 when it is left out (a custom
        non-sequence model, where one sample is the unit of work: FLOPs per sample ≈ 6·N, activations
        per sample, ``tokens`` counts samples)."""
        return self.seq_len if self.seq_len is not None else 1

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len_eff * self.global_batch

    def total_steps(self, dataset_tokens: int | None = None) -> int:
        """Optimizer steps for the whole run; ``epochs`` needs the dataset size in tokens."""
        if self.steps is not None:
            return self.steps
        if self.tokens is not None:
            return max(1, math.ceil(self.tokens / self.tokens_per_step))
        assert self.epochs is not None
        size = dataset_tokens if dataset_tokens is not None else self.dataset_tokens
        if size is None:
            from trainyard.errors import SpecError

            raise SpecError(
                "workload.epochs: the dataset size is unknown, so epochs cannot be turned into steps",
                hint="Set workload.dataset_tokens, or give workload.steps or workload.tokens instead.",
            )
        return max(1, math.ceil(self.epochs * size / self.tokens_per_step))


class ResourcesSpec(_Strict):
    min_memory_per_device_gib: Annotated[float, Field(ge=MIN_POSITIVE, le=1e6)] | None = None
    min_interconnect_gbps: Annotated[float, Field(ge=MIN_POSITIVE, le=1e7)] | None = None
    min_devices: Annotated[int, Field(ge=1, le=MAX_DEVICES)] | None = None
    max_devices: Annotated[int, Field(ge=1, le=MAX_DEVICES)] | None = None
    accelerator_hours: Annotated[float, Field(ge=MIN_POSITIVE, le=1e9)] | None = None

    @model_validator(mode="after")
    def _check_range(self) -> ResourcesSpec:
        if (
            self.min_devices is not None
            and self.max_devices is not None
            and self.min_devices > self.max_devices
        ):
            raise ValueError(f"min_devices {self.min_devices} exceeds max_devices {self.max_devices}")
        return self


class RequirementsSpec(_Strict):
    frameworks: list[str] = Field(default_factory=list)
    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    regions: list[str] = Field(default_factory=list)

    @field_validator("frameworks", "allow", "deny", mode="after")
    @classmethod
    def _lower(cls, v: list[str]) -> list[str]:
        return [s.strip().lower() for s in v]

    @field_validator("allow", "deny", mode="after")
    @classmethod
    def _known_names(cls, v: list[str]) -> list[str]:
        from trainyard.catalog.names import ACCELERATOR_NAMES, FAMILIES, normalize_accelerator_name

        out = []
        for name in v:
            if name in FAMILIES:
                out.append(name)
                continue
            canonical = normalize_accelerator_name(name)
            if canonical is None:
                raise ValueError(
                    f"{name!r} is not an accelerator name or family; accelerators: "
                    f"{', '.join(ACCELERATOR_NAMES)}; families: {', '.join(FAMILIES)}"
                )
            out.append(canonical)
        return out

    @field_validator("frameworks", mode="after")
    @classmethod
    def _known_frameworks(cls, v: list[str]) -> list[str]:
        from trainyard.catalog.names import FRAMEWORKS

        for f in v:
            if f not in FRAMEWORKS:
                raise ValueError(f"{f!r} is not one of {', '.join(sorted(FRAMEWORKS))}")
        return v


_DURATION_RE = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)d)?\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*$"
)


def parse_duration_s(value: str | float | int) -> float:
    """Parse ``36h``, ``90m``, ``1h30m``, ``2d``, ``45s`` or a number of seconds into seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration must be like 36h, 90m, 1h30m or a number of seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION_RE.match(value)
        if not value.strip() or not m or not any(m.groups()):
            raise ValueError(f"{value!r} is not a duration like 36h, 90m, 1h30m, 2d or 45s")
        d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        seconds = d * 86400 + h * 3600 + mi * 60 + s
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    if seconds < MIN_DURATION_S:
        raise ValueError(f"duration {value!r} is shorter than a millisecond")
    if seconds > 10 * 365 * 86400:
        raise ValueError(f"duration {value!r} is longer than ten years")
    return seconds


class ObjectiveSpec(_Strict):
    minimize: Minimize = Minimize.COST
    deadline: str | None = None
    budget_usd: Annotated[float, Field(ge=MIN_POSITIVE, le=1e12)] | None = None
    markets: list[Market] = Field(default_factory=lambda: [Market.SPOT, Market.ON_DEMAND, Market.RESERVED])

    @field_validator("deadline", mode="before")
    @classmethod
    def _check_deadline(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, datetime):
            return v.isoformat()
        if isinstance(v, int | float) and not isinstance(v, bool):
            parse_duration_s(v)
            return f"{float(v)}s"
        if not isinstance(v, str):
            raise ValueError("deadline must be a duration like 36h or an ISO-8601 timestamp")
        try:
            parse_duration_s(v)
            return v
        except ValueError:
            pass
        try:
            ts = datetime.fromisoformat(v)
        except ValueError:
            raise ValueError(f"{v!r} is neither a duration like 36h nor an ISO-8601 timestamp") from None
        if ts.tzinfo is None:
            raise ValueError(f"timestamp {v!r} needs a timezone, e.g. 2026-12-01T12:00:00Z")
        return v

    @field_validator("markets", mode="after")
    @classmethod
    def _nonempty(cls, v: list[Market]) -> list[Market]:
        if not v:
            raise ValueError("allow at least one market: spot, on_demand, reserved")
        return list(dict.fromkeys(v))

    def deadline_s(self, now: datetime | None = None) -> float | None:
        """Seconds from ``now`` (submission time) to the deadline; pure: the caller passes the clock."""
        if self.deadline is None:
            return None
        try:
            return parse_duration_s(self.deadline)
        except ValueError:
            ts = datetime.fromisoformat(self.deadline)
            if now is None:
                raise ValueError("an absolute deadline needs the submission time") from None
            return (ts - now).total_seconds()


class CheckpointSpec(_Strict):
    # "auto", a duration string, or a number of seconds (stored as "<n>s"): the schema says so too
    interval: Annotated[
        str,
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "string"},
                    {"type": "number", "minimum": MIN_DURATION_S, "maximum": 315360000},
                ],
                "default": "auto",
                "title": "Interval",
            }
        ),
    ] = "auto"
    storage: str | None = None
    keep_last: Annotated[int, Field(ge=1, le=1000)] = 3

    @field_validator("interval", mode="before")
    @classmethod
    def _check_interval(cls, v: Any) -> Any:
        if v == "auto":
            return v
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise ValueError("must be auto, a duration like 15m, or a number of seconds")
        parse_duration_s(v)
        return v if isinstance(v, str) else f"{float(v)}s"

    @field_validator("storage", mode="after")
    @classmethod
    def _check_storage(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if "://" not in v:
            raise ValueError(f"{v!r} is not a URL; use file:///path, s3://bucket/prefix, gs://...")
        return v

    @property
    def interval_s(self) -> float | None:
        """The pinned interval in seconds, or None for ``auto`` (the cost model chooses)."""
        return None if self.interval == "auto" else parse_duration_s(self.interval)


class MeasuredSpec(_Strict):
    step_time_s: dict[str, Annotated[float, Field(ge=MIN_POSITIVE, le=1e7)]] = Field(default_factory=dict)

    @field_validator("step_time_s", mode="after")
    @classmethod
    def _canonical(cls, v: dict[str, float]) -> dict[str, float]:
        from trainyard.catalog.names import ACCELERATOR_NAMES, normalize_accelerator_name

        out: dict[str, float] = {}
        for name, t in v.items():
            canonical = normalize_accelerator_name(name)
            if canonical is None:
                raise ValueError(
                    f"{name!r} is not an accelerator; accelerators: {', '.join(ACCELERATOR_NAMES)}"
                )
            out[canonical] = t
        return out


class EntrypointSpec(_Strict):
    """Escape hatch: run the user's own training script (it uses ``trainyard.runtime.init()``)."""

    command: Annotated[list[str], Field(min_length=1)]
    # the code the command runs in: an archive uploaded with `trainyard submit --workdir DIR`
    # (a URL under the tenant's code area); the command's working directory is its unpacked tree
    code: Annotated[str, Field(min_length=1, max_length=2000)] | None = None

    @field_validator("command", mode="after")
    @classmethod
    def _nonempty_program(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("the first element of command must name the program to run")
        return v


class JobSpec(_Strict):
    """A training or fine-tuning job, described without naming chips."""

    api_version: Literal["trainyard/v1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["TrainingJob"] = KIND
    name: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")]
    tags: dict[str, str] = Field(default_factory=dict)
    model: ModelSpec
    workload: WorkloadSpec
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    requirements: RequirementsSpec = Field(default_factory=RequirementsSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    measured: MeasuredSpec = Field(default_factory=MeasuredSpec)
    entrypoint: EntrypointSpec | None = None

    @field_validator("tags", mode="before")
    @classmethod
    def _tags_list(cls, v: Any) -> Any:
        if isinstance(v, list):
            return {str(t): "" for t in v}
        return v

    @model_validator(mode="after")
    def _check_seq_len(self) -> JobSpec:
        if self.workload.seq_len is None and not self.model.is_custom:
            raise ValueError(
                f"workload.seq_len: required for {self.model.architecture.value} models "
                "(only architecture: custom may leave it out)"
            )
        return self

    @model_validator(mode="after")
    def _check_expert_pin(self) -> JobSpec:
        par = self.workload.parallelism
        if isinstance(par, ParallelismPin) and par.expert is not None and par.expert > 1:
            experts = self.model.n_experts
            if experts is None or experts < 2:
                raise ValueError(
                    "workload.parallelism.expert: expert parallelism needs an MoE model (model.n_experts > 1)"
                )
            if experts % par.expert:
                raise ValueError(
                    f"workload.parallelism.expert: {par.expert} does not divide model.n_experts {experts}"
                )
        return self

    def to_document(self) -> dict[str, Any]:
        """The spec as a JSON-able document, with the contract's key names."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    # ---- derived -----------------------------------------------------------------------------
    @property
    def params(self) -> int:
        return self.model.params

    @property
    def trainable_params(self) -> int:
        """Parameters that receive gradients and optimizer state (LoRA adapters only for LoRA)."""
        if self.workload.method == Method.FULL:
            return self.model.params
        return lora_params(self.model, self.workload.lora_rank)

    @property
    def tokens_per_step(self) -> int:
        return self.workload.tokens_per_step

    @property
    def total_steps(self) -> int:
        return self.workload.total_steps()

    @property
    def total_tokens(self) -> int:
        return self.total_steps * self.tokens_per_step


def lora_params(model: ModelSpec, rank: int) -> int:
    """LoRA adapter parameters on the attention and FFN projections of every block.

    Each adapted ``d_in × d_out`` matrix gains ``rank·(d_in + d_out)`` parameters. For a custom
    model (no shapes) we assume a Llama-like shape derived from the parameter count.
    """
    if model.is_custom:
        assert model.params_b is not None
        n = model.params_b * 1e9
        # Llama-like: N ≈ 12·L·d², L ≈ d/128  ⇒ d ≈ (N·128/12)^(1/3)
        d = (n * 128 / 12) ** (1 / 3)
        layers = max(1.0, d / 128)
        return round(layers * 7 * rank * 2 * d)  # 7 projections of roughly d×d (q,k,v,o + 3 FFN)
    assert model.d_model is not None
    d = model.d_model
    assert model.n_heads is not None
    q_dim = model.n_heads * model.head_dim_eff
    kv_dim = model.n_kv_heads_eff * model.head_dim_eff
    attn = rank * ((d + q_dim) * 2 + (d + kv_dim) * 2)
    ffn_mats = 3 if model.ffn == FFNKind.GATED else 2
    ffn = rank * ffn_mats * (d + model.d_ff_eff)
    experts = model.n_experts or 1
    return model.n_blocks * (attn + experts * ffn)
