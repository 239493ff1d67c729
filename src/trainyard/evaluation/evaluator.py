"""The built-in evaluator: per-example scores of one model on one split (runs inside an evaluation job).

For every row of a JSONL split (formats ``text``, ``completion``, ``chat``) it computes:

- ``loss``: mean per-token cross-entropy of the reference tokens given the prompt (the whole text for
  ``text`` rows) — lower is better; ``perplexity`` is ``exp`` of the split's token-weighted mean loss;
- for ``completion`` and ``chat`` rows, a greedy generation as long as the reference (in tokens) and
  ``exact_match`` (whitespace-normalised output equals the reference);
- generation time per generated token (the latency guardrail).

Task metrics are plug-ins: ``METRICS[name] = fn(output, reference) -> float`` adds a per-example score.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
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
    ``latency_s_per_token`` is the generation wall time over the decoding steps: the time per token
    that each sequence of a batch waits."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    model.eval()
    if progress is not None:
        progress(0)  # loaded (a worker's heartbeat between loading and the first batch)
    gen = (fmt != "text") if generate is None else generate
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    eos = _eos_ids(model, tok)
    size = max(1, int(batch_size))
    n = len(rows)
    refs: list[str] = []
    prompts: list[list[int]] = []
    seqs: list[list[int]] = []
    n_refs: list[int] = []
    budgets: list[int] = []
    for row in rows:
        prompt, ref = split_example(row, fmt, tok)
        p_ids = tok(prompt, add_special_tokens=False).input_ids if prompt else []
        if not p_ids and tok.bos_token_id is not None:
            p_ids = [tok.bos_token_id]
        r_ids = tok(ref, add_special_tokens=False).input_ids or [pad_id]
        ids = (p_ids + r_ids)[-max_len:]
        refs.append(ref)
        prompts.append(p_ids[-max_len:])
        seqs.append(ids)
        n_refs.append(min(len(r_ids), len(ids) - 1))
        budgets.append(min(max_new_tokens, len(r_ids)))
    losses: list[float] = [0.0] * n
    outputs: list[str] = [""] * n
    em: list[float] = [0.0] * n
    extra: dict[str, list[float]] = {k: [0.0] * n for k in METRICS}
    gen_s = 0.0
    gen_steps = 0
    gen_tokens = 0
    done = 0
    order = sorted(range(n), key=lambda i: (len(seqs[i]), len(prompts[i])))
    with torch.inference_mode():
        lengths = [max(len(seqs[i]), len(prompts[i])) for i in range(n)]
        for chunk in _batches(order, lengths, size, max(1, int(max_batch_tokens))):
            # loss: right-padded, the reference tokens' cross-entropy given everything before them
            width = max(len(seqs[i]) for i in chunk)
            x = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, i in enumerate(chunk):
                x[j, : len(seqs[i])] = torch.tensor(seqs[i])
                mask[j, : len(seqs[i])] = 1
            logits = model(input_ids=x, attention_mask=mask).logits
            for j, i in enumerate(chunk):
                length, k = len(seqs[i]), n_refs[i]
                if k <= 0:
                    losses[i] = 1e4
                    continue
                pred = logits[j, length - k - 1 : length - 1].float()
                loss = float(F.cross_entropy(pred, x[j, length - k : length]))
                losses[i] = loss if math.isfinite(loss) else 1e4
            if gen:
                # greedy generation: left-padded prompts, each cut to its own budget and first EOS
                p_width = max(len(prompts[i]) for i in chunk)
                px = torch.full((len(chunk), p_width), pad_id, dtype=torch.long)
                pmask = torch.zeros((len(chunk), p_width), dtype=torch.long)
                for j, i in enumerate(chunk):
                    px[j, p_width - len(prompts[i]) :] = torch.tensor(prompts[i])
                    pmask[j, p_width - len(prompts[i]) :] = 1
                t0 = time.perf_counter()
                g = model.generate(
                    px,
                    attention_mask=pmask,
                    max_new_tokens=max(budgets[i] for i in chunk),
                    do_sample=False,
                    pad_token_id=pad_id,
                )
                gen_s += time.perf_counter() - t0
                gen_steps += int(g.shape[1] - p_width)
                for j, i in enumerate(chunk):
                    new = g[j, p_width : p_width + budgets[i]].tolist()
                    for pos, t in enumerate(new):
                        if t in eos:
                            new = new[: pos + 1]
                            break
                    gen_tokens += len(new)
                    text = _truncate_like(str(tok.decode(new, skip_special_tokens=True)), refs[i])
                    outputs[i] = text
                    em[i] = exact_match(text, refs[i])
                    for name, fn in METRICS.items():
                        extra[name][i] = float(fn(text, refs[i]))
            done += len(chunk)
            if progress is not None:
                progress(done)
    total_tokens = max(1, sum(n_refs))
    mean_loss = sum(loss * k for loss, k in zip(losses, n_refs, strict=True)) / total_tokens
    doc: dict[str, Any] = {
        "loss": losses,
        "tokens": n_refs,
        "mean_loss": mean_loss,
        "perplexity": math.exp(min(mean_loss, 50.0)),
        "generated_tokens": gen_tokens,
        "latency_s_per_token": gen_s / gen_steps if gen_steps else None,
        "batch_size": size,
    }
    if gen:
        doc["outputs"] = outputs
        doc["exact_match"] = em
        doc.update(extra)
    return doc


def _truncate_like(output: str, reference: str) -> str:
    """Greedy generation runs past the answer; keep as many lines as the reference has."""
    lines = output.split("\n")
    return "\n".join(lines[: max(1, reference.count("\n") + 1)])


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
    """Scores of the model and the baseline on the same rows, in the same order."""
    f = fmt or detect_format(rows)
    n = len(rows)
    model = score_model(
        model_dir, rows, f, max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress
    )
    base = score_model(
        baseline_dir,
        rows,
        f,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        progress=(lambda i: progress(n + i)) if progress else None,
    )
    return {"format": f, "n": n, "model": model, "baseline": base}


def examples_of(rows: Iterable[dict[str, Any]], fmt: str) -> list[tuple[str, str]]:
    return [split_example(r, fmt) for r in rows]
