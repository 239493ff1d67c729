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


def score_model(
    model_dir: str | Path,
    rows: list[dict[str, Any]],
    fmt: str,
    *,
    max_new_tokens: int = 32,
    max_len: int = 512,
    generate: bool | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Per-example scores of the model in ``model_dir`` (an HF directory with its tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    model.eval()
    gen = (fmt != "text") if generate is None else generate
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    losses: list[float] = []
    tokens: list[int] = []
    outputs: list[str] = []
    em: list[float] = []
    extra: dict[str, list[float]] = {k: [] for k in METRICS}
    gen_s = 0.0
    gen_tokens = 0
    with torch.inference_mode():
        for i, row in enumerate(rows):
            prompt, ref = split_example(row, fmt, tok)
            p_ids = tok(prompt, add_special_tokens=False).input_ids if prompt else []
            if not p_ids and tok.bos_token_id is not None:
                p_ids = [tok.bos_token_id]
            r_ids = tok(ref, add_special_tokens=False).input_ids or [pad_id]
            ids = (p_ids + r_ids)[-max_len:]
            n_ref = min(len(r_ids), len(ids) - 1)
            x = torch.tensor([ids])
            labels = x.clone()
            labels[:, : len(ids) - n_ref] = -100
            out = model(input_ids=x, labels=labels)
            loss = float(out.loss)
            losses.append(loss if math.isfinite(loss) else 1e4)
            tokens.append(n_ref)
            if gen:
                prompt_x = torch.tensor([p_ids[-max_len:]])
                budget = min(max_new_tokens, len(r_ids))
                t0 = time.perf_counter()
                g = model.generate(
                    prompt_x,
                    attention_mask=torch.ones_like(prompt_x),
                    max_new_tokens=budget,
                    do_sample=False,
                    pad_token_id=pad_id,
                )
                gen_s += time.perf_counter() - t0
                new = g[0, prompt_x.shape[1] :]
                gen_tokens += int(new.shape[0])
                text = str(tok.decode(new, skip_special_tokens=True))
                text = _truncate_like(text, ref)
                outputs.append(text)
                em.append(exact_match(text, ref))
                for name, fn in METRICS.items():
                    extra[name].append(float(fn(text, ref)))
            if progress is not None:
                progress(i + 1)
    total_tokens = max(1, sum(tokens))
    mean_loss = sum(loss * n for loss, n in zip(losses, tokens, strict=True)) / total_tokens
    doc: dict[str, Any] = {
        "loss": losses,
        "tokens": tokens,
        "mean_loss": mean_loss,
        "perplexity": math.exp(min(mean_loss, 50.0)),
        "generated_tokens": gen_tokens,
        "latency_s_per_token": gen_s / gen_tokens if gen_tokens else None,
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
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Scores of the model and the baseline on the same rows, in the same order."""
    f = fmt or detect_format(rows)
    n = len(rows)
    model = score_model(model_dir, rows, f, max_new_tokens=max_new_tokens, progress=progress)
    base = score_model(
        baseline_dir,
        rows,
        f,
        max_new_tokens=max_new_tokens,
        progress=(lambda i: progress(n + i)) if progress else None,
    )
    return {"format": f, "n": n, "model": model, "baseline": base}


def examples_of(rows: Iterable[dict[str, Any]], fmt: str) -> list[tuple[str, str]]:
    return [split_example(r, fmt) for r in rows]
