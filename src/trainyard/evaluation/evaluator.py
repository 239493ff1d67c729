"""The built-in evaluator: per-example scores of one model on one split (runs inside an evaluation job).

For every row of a JSONL split (formats ``text``, ``completion``, ``chat``) it computes:

- ``loss``: mean per-token cross-entropy of the reference tokens given the prompt (the whole text for
  ``text`` rows) — lower is better; ``perplexity`` is ``exp`` of the split's token-weighted mean loss;
- for ``completion`` and ``chat`` rows, a greedy generation as long as the reference (in tokens) and
  ``exact_match`` (whitespace-normalised output equals the reference);
- generation time per output token after the first, and to the first (the latency guardrail).

Task metrics are plug-ins: ``METRICS[name] = fn(output, reference) -> float`` adds a per-example score.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRICS: dict[str, Callable[[str, str], float]] = {}


def _norm(text: str) -> str:
    return " ".join(text.split())


def exact_match(output: str, reference: str) -> float:
    return 1.0 if _norm(output) == _norm(reference) else 0.0


def read_rows(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
                if limit is not None and len(rows) >= limit:
                    break
    return rows


def detect_format(rows: list[dict[str, Any]]) -> str:
    first = rows[0] if rows else {}
    if "messages" in first:
        return "chat"
    if "prompt" in first and "completion" in first:
        return "completion"
    return "text"


def split_example(row: Any, fmt: str, tokenizer: Any = None) -> tuple[str, str]:
    """(prompt, reference) of one row."""
    if fmt == "completion":  # the trainer sees completion rows as prompt + "\n" + completion
        return str(row["prompt"]) + "\n", str(row["completion"])
    if fmt == "chat":
        msgs = list(row["messages"])
        last = msgs[-1]
        head = msgs[:-1]
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            prompt = tokenizer.apply_chat_template(head, tokenize=False, add_generation_prompt=True)
        else:
            prompt = "".join(f"{m['role']}: {m['content']}\n" for m in head) + f"{last['role']}:"
        return str(prompt), str(last["content"])
    text = row["text"] if isinstance(row, dict) else str(row)
    return "", str(text)


DEFAULT_BATCH_SIZE = 16
# a batch's padded tokens, so that long rows come fewer at a time (the loss pass holds batch x length
# x vocabulary logits: 2,048 tokens of a 49k-token vocabulary are 400 MB in fp32)
DEFAULT_MAX_BATCH_TOKENS = 2048


def _eos_ids(model: Any, tok: Any) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = tok.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}


def _batches(order: list[int], lengths: list[int], size: int, max_tokens: int) -> Iterable[list[int]]:
    """Consecutive runs of ``order`` (sorted by length) of at most ``size`` rows and, padded to their
    longest row, at most ``max_tokens`` tokens (a longer row goes alone)."""
    chunk: list[int] = []
    width = 0
    for i in order:
        w = max(width, lengths[i])
        if chunk and (len(chunk) >= size or (len(chunk) + 1) * w > max_tokens):
            yield chunk
            chunk, w = [], lengths[i]
        chunk.append(i)
        width = w
    if chunk:
        yield chunk


class _Scorer:
    """One model's scores on one split, a batch at a time (see :func:`score_model`): loading and
    tokenising happen at construction, :meth:`score` runs one batch of ``chunks``, :meth:`document`
    gives the scores once every batch has run."""

    def __init__(
        self,
        model_dir: str | Path,
        rows: list[dict[str, Any]],
        fmt: str,
        *,
        max_new_tokens: int,
        max_len: int,
        generate: bool | None,
        batch_size: int,
        max_batch_tokens: int,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(0)
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), local_files_only=True, dtype=torch.float32
        )
        model.eval()
        self.tok, self.model = tok, model
        self.gen = (fmt != "text") if generate is None else generate
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        self.eos = _eos_ids(model, tok)
        self.size = max(1, int(batch_size))
        n = self.n = len(rows)
        self.refs: list[str] = []
        self.prompts: list[list[int]] = []
        self.seqs: list[list[int]] = []
        self.n_refs: list[int] = []
        self.budgets: list[int] = []
        for row in rows:
            prompt, ref = split_example(row, fmt, tok)
            p_ids = tok(prompt, add_special_tokens=False).input_ids if prompt else []
            if not p_ids and tok.bos_token_id is not None:
                p_ids = [tok.bos_token_id]
            r_ids = tok(ref, add_special_tokens=False).input_ids or [self.pad_id]
            ids = (p_ids + r_ids)[-max_len:]
            self.refs.append(ref)
            self.prompts.append(p_ids[-max_len:])
            self.seqs.append(ids)
            self.n_refs.append(min(len(r_ids), len(ids) - 1))
            self.budgets.append(min(max_new_tokens, len(r_ids)))
        self.losses: list[float] = [0.0] * n
        self.outputs: list[str] = [""] * n
        self.em: list[float] = [0.0] * n
        self.extra: dict[str, list[float]] = {k: [0.0] * n for k in METRICS}
        self.gen_s = 0.0
        self.gen_steps = 0
        self.gen_batches: list[BatchTiming] = []
        self.gen_tokens = 0
        self.done = 0
        order = sorted(range(n), key=lambda i: (len(self.seqs[i]), len(self.prompts[i])))
        lengths = [max(len(self.seqs[i]), len(self.prompts[i])) for i in range(n)]
        self.chunks = list(_batches(order, lengths, self.size, max(1, int(max_batch_tokens))))

    def score(self, chunk: list[int]) -> None:
        import torch
        import torch.nn.functional as F

        seqs, prompts, pad_id = self.seqs, self.prompts, self.pad_id
        with torch.inference_mode():
            # loss: right-padded, the reference tokens' cross-entropy given everything before them
            width = max(len(seqs[i]) for i in chunk)
            x = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, i in enumerate(chunk):
                x[j, : len(seqs[i])] = torch.tensor(seqs[i])
                mask[j, : len(seqs[i])] = 1
            logits = self.model(input_ids=x, attention_mask=mask).logits
            for j, i in enumerate(chunk):
                length, k = len(seqs[i]), self.n_refs[i]
                if k <= 0:
                    self.losses[i] = 1e4
                    continue
                pred = logits[j, length - k - 1 : length - 1].float()
                loss = float(F.cross_entropy(pred, x[j, length - k : length]))
                self.losses[i] = loss if math.isfinite(loss) else 1e4
            if self.gen:
                # greedy generation: left-padded prompts, each cut to its own budget and first EOS
                p_width = max(len(prompts[i]) for i in chunk)
                px = torch.full((len(chunk), p_width), pad_id, dtype=torch.long)
                pmask = torch.zeros((len(chunk), p_width), dtype=torch.long)
                for j, i in enumerate(chunk):
                    px[j, p_width - len(prompts[i]) :] = torch.tensor(prompts[i])
                    pmask[j, p_width - len(prompts[i]) :] = 1
                clock = _StepClock()
                t0 = time.perf_counter()
                g = self.model.generate(
                    px,
                    attention_mask=pmask,
                    max_new_tokens=max(self.budgets[i] for i in chunk),
                    do_sample=False,
                    pad_token_id=pad_id,
                    streamer=clock,
                )
                took_s, steps = time.perf_counter() - t0, int(g.shape[1] - p_width)
                self.gen_s += took_s
                self.gen_steps += steps
                self.gen_batches.append(
                    BatchTiming(
                        took_s=took_s,
                        steps=steps,
                        first_token_s=clock.times[0] - t0 if clock.times else None,
                        decode_s=clock.times[-1] - clock.times[0] if len(clock.times) >= 2 else None,
                    )
                )
                for j, i in enumerate(chunk):
                    new = g[j, p_width : p_width + self.budgets[i]].tolist()
                    for pos, t in enumerate(new):
                        if t in self.eos:
                            new = new[: pos + 1]
                            break
                    self.gen_tokens += len(new)
                    text = _truncate_like(str(self.tok.decode(new, skip_special_tokens=True)), self.refs[i])
                    self.outputs[i] = text
                    self.em[i] = exact_match(text, self.refs[i])
                    for name, fn in METRICS.items():
                        self.extra[name][i] = float(fn(text, self.refs[i]))
        self.done += len(chunk)

    def document(self) -> dict[str, Any]:
        n_refs = self.n_refs
        total_tokens = max(1, sum(n_refs))
        mean_loss = sum(loss * k for loss, k in zip(self.losses, n_refs, strict=True)) / total_tokens
        doc: dict[str, Any] = {
            "loss": self.losses,
            "tokens": n_refs,
            "mean_loss": mean_loss,
            "perplexity": math.exp(min(mean_loss, 50.0)),
            "generated_tokens": self.gen_tokens,
            "latency_s_per_token": latency_s_per_token(self.gen_batches),
            "latency_s_per_token_mean": self.gen_s / self.gen_steps if self.gen_steps else None,
            "time_to_first_token_s": time_to_first_token_s(self.gen_batches),
            "batch_size": self.size,
        }
        if self.gen:
            doc["outputs"] = self.outputs
            doc["exact_match"] = self.em
            doc.update(self.extra)
        return doc


@dataclass(frozen=True)
class BatchTiming:
    """When one batch's generation spent its time: ``took_s`` for the whole ``generate`` call (set-up
    and the prompt's forward pass included) over ``steps`` decoding steps; ``first_token_s`` from the
    call to the first step's tokens; ``decode_s`` from the first step's tokens to the last's (``None``
    with fewer than two steps)."""

    took_s: float
    steps: int
    first_token_s: float | None = None
    decode_s: float | None = None


class _StepClock:
    """A ``generate`` streamer that notes when each decoding step's tokens arrive (the first ``put``
    is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if self._prompt_seen:
            self.times.append(time.perf_counter())
        self._prompt_seen = True

    def end(self) -> None:
        return None


def latency_s_per_token(batches: list[BatchTiming]) -> float | None:
    """The time per output token after the first: the median over batches of a batch's time from its
    first step's tokens to its last's over the steps in between (``None`` without a batch that
    decoded). Batches of a single step have no such interval; only when no batch has two steps is it
    a batch's whole time per step.

    The first token is left out because it carries the call's fixed set-up and the prompt's forward
    pass: spread over the steps, it made a model that stops early (a fine-tune that answers in a
    few tokens and ends) look several times slower per token than its base that runs to the budget
    when a busy machine slowed that fixed part. A median, not the total over the total: on a shared
    machine one batch held up by another process would otherwise move the latency the guardrail
    compares."""
    decode = [b.decode_s / (b.steps - 1) for b in batches if b.decode_s is not None and b.steps >= 2]
    if decode:
        return statistics.median(decode)
    per_step = [b.took_s / b.steps for b in batches if b.steps > 0]
    return statistics.median(per_step) if per_step else None


def time_to_first_token_s(batches: list[BatchTiming]) -> float | None:
    """The median over batches of the time from the ``generate`` call to the first step's tokens."""
    first = [b.first_token_s for b in batches if b.first_token_s is not None and b.steps > 0]
    return statistics.median(first) if first else None


def score_model(
    model_dir: str | Path,
    rows: list[dict[str, Any]],
    fmt: str,
    *,
    max_new_tokens: int = 32,
    max_len: int = 512,
    generate: bool | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Per-example scores of the model in ``model_dir`` (an HF directory with its tokenizer).

    Rows are scored up to ``batch_size`` at a time (and ``max_batch_tokens`` padded tokens), grouped by
    length to keep padding small, and the results
    are returned in the rows' order. The loss pass pads on the right (causal attention never looks at
    the padding, positions are those of the unpadded row); generation pads the prompts on the left with
    an attention mask (``generate`` derives the positions from it), runs to the longest budget in the
    batch and cuts each output to its own budget and first end-of-sequence token, as a row generated
    alone would stop. Scores agree with ``batch_size=1`` to float rounding (checked by the unit tests).
    ``latency_s_per_token`` is the median over batches of the time per output token after the first
    (:func:`latency_s_per_token`): the time per token that each sequence of a batch waits once it
    is generating; ``time_to_first_token_s`` the median time to a batch's first tokens;
    ``latency_s_per_token_mean`` the total time over the total steps."""
    scorer = _Scorer(
        model_dir,
        rows,
        fmt,
        max_new_tokens=max_new_tokens,
        max_len=max_len,
        generate=generate,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
    )
    if progress is not None:
        progress(0)  # loaded (a worker's heartbeat between loading and the first batch)
    for chunk in scorer.chunks:
        scorer.score(chunk)
        if progress is not None:
            progress(scorer.done)
    return scorer.document()


def _truncate_like(output: str, reference: str) -> str:
    """Greedy generation runs past the answer; keep as many lines as the reference has."""
    lines = output.split("\n")
    return "\n".join(lines[: max(1, reference.count("\n") + 1)])


def side_by_side(model_batches: int, baseline_batches: int) -> Iterable[tuple[int, tuple[str, ...]]]:
    """The order in which :func:`evaluate_pair` runs the two models' batches: round ``k`` runs batch
    ``k`` of each that has one, the model first in even rounds and the baseline first in odd ones (a
    load that rises or falls across a round weighs on both alike)."""
    for k in range(max(model_batches, baseline_batches)):
        first, second = ("model", "baseline") if k % 2 == 0 else ("baseline", "model")
        counts = {"model": model_batches, "baseline": baseline_batches}
        yield k, tuple(w for w in (first, second) if k < counts[w])


def evaluate_pair(
    model_dir: str | Path,
    baseline_dir: str | Path,
    rows: list[dict[str, Any]],
    *,
    fmt: str | None = None,
    max_new_tokens: int = 32,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Scores of the model and the baseline on the same rows, in the same order.

    The two are scored side by side, a batch of each in turn (the model first in even rounds, the
    baseline first in odd ones), so that their generation latencies, which the latency guardrail
    compares, are measured over the same stretch of time: on a shared machine a model scored alone
    after the other would carry whatever load came and went in between. The scores themselves do not
    depend on the order. Both models are in memory together: inference holds a model's weights only,
    and an evaluation job is placed with the memory of a training job on the model (weights,
    gradients and optimizer state). ``progress`` gets the rows scored so far by both (0 to twice the
    rows)."""
    f = fmt or detect_format(rows)
    n = len(rows)
    opts: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "max_len": 512,
        "generate": None,
        "batch_size": batch_size,
        "max_batch_tokens": DEFAULT_MAX_BATCH_TOKENS,
    }
    model = _Scorer(model_dir, rows, f, **opts)
    base = _Scorer(baseline_dir, rows, f, **opts)
    if progress is not None:
        progress(0)  # both loaded
    scorers = {"model": model, "baseline": base}
    for k, turns in side_by_side(len(model.chunks), len(base.chunks)):
        for which in turns:
            scorers[which].score(scorers[which].chunks[k])
        if progress is not None:
            progress(model.done + base.done)
    return {"format": f, "n": n, "model": model.document(), "baseline": base.document()}


def examples_of(rows: Iterable[dict[str, Any]], fmt: str) -> list[tuple[str, str]]:
    return [split_example(r, fmt) for r in rows]
