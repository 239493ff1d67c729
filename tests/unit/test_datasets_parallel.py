"""Pass 1 in worker processes over byte ranges of the file: exactly the sequential outcome."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
from test_datasets_ingest import chat_rows, near_duplicate_rows

from trainyard.datasets import parallel
from trainyard.datasets.ingest import IngestOptions, ingest
from trainyard.errors import InvalidDatasetError


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def encoded(rows: list[Any]) -> list[bytes]:
    return [(r if isinstance(r, str) else json.dumps(r)).encode() + b"\n" for r in rows]


def outcome(path: Path, tmp: Path, name: str, **opts: Any) -> tuple[Any, ...]:
    """Everything an upload produces: identity, counts, manifest and split files (bytes), and how
    pass 1 went."""
    with open(path, "rb") as fh:
        ing = ingest(fh, IngestOptions(**opts), tmp / "spool")
    try:
        ing.write(f"file://{tmp}/{name}")
        files = tuple((tmp / name / f"{s}.jsonl").read_bytes() for s in ("train", "eval"))
        manifest = (tmp / name / "manifest.json").read_bytes()
        facts = (ing.sha256, ing.split_key, ing.rows, ing.lines, ing.bytes, ing.duplicates_removed)
        return facts, manifest, files, ing.work["pass1"]
    finally:
        ing.close()


def refusal(path: Path, tmp: Path, **opts: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    with open(path, "rb") as fh, pytest.raises(InvalidDatasetError) as info:
        ingest(fh, IngestOptions(**opts), tmp / "spool")
    return info.value.message, info.value.details, info.value.to_dict()


def mixed_chat_lines(seed: int) -> list[bytes]:
    """Chat rows as uploads have them: families of near-duplicates and exact duplicates spread over the
    file, rows that take the validating path (NFD text, extra keys, `name` and `weight`, other key
    order and spacing), blank lines, CRLF line ends; the last line has no newline."""
    rng = random.Random(seed)
    rows = near_duplicate_rows(400, seed=seed)
    lines = encoded(rows)
    odd = [
        {"messages": [{"role": "user", "content": "Cafe\u0301 ?"}, {"role": "assistant", "content": "oui"}]},
        {
            "messages": [
                {"role": "user", "content": "x", "name": "bob"},
                {"role": "assistant", "content": "y"},
            ]
        },
        {"messages": [{"role": "user", "content": "w"}, {"role": "assistant", "content": "z", "weight": 0}]},
        {"id": 3, "messages": [{"role": "user", "content": "extra"}, {"role": "assistant", "content": "k"}]},
    ]
    for i, r in enumerate(odd * 5):
        lines.insert(rng.randrange(len(lines)), json.dumps(r, separators=(" , ", " : ")).encode() + b"\n")
        if i % 3 == 0:
            lines.insert(rng.randrange(len(lines)), b"   \n")
    for _ in range(10):
        k = rng.randrange(len(lines))
        lines[k] = lines[k].rstrip(b"\n") + b"\r\n"
    lines += lines[:: len(lines) // 7]  # duplicates at the end of rows first seen in other ranges
    lines[-1] = lines[-1].rstrip(b"\r\n")
    return lines


@pytest.mark.parametrize("fmt", ["auto", "chat"])
def test_parallel_pass1_gives_the_sequential_outcome_byte_for_byte(fmt: str, tmp_path: Path) -> None:
    """Ranges of a few KiB (so duplicates, near-duplicates and blank lines fall in other ranges than
    their first occurrence), in memory and spilled: the content address, split key, counts, manifest
    and both split files are the sequential scan's, byte for byte."""
    path = write_lines(tmp_path / "chat.jsonl", mixed_chat_lines(seed=4))
    common: dict[str, Any] = {"format": fmt, "eval_fraction": 0.3}
    want = outcome(path, tmp_path, "seq", workers=1, **common)
    assert want[3]["workers"] == 1
    facts = json.loads(want[1])
    assert facts["duplicates_removed"] > 50 and facts["near_duplicates_kept_in_train"] > 0
    for k, (workers, chunk, budget) in enumerate(
        [(2, 4096, 64 << 20), (3, 777, 64 << 10), (2, 1 << 20, 64 << 20)]
    ):
        got = outcome(
            path, tmp_path, f"par{k}", workers=workers, chunk_bytes=chunk, memory_budget=budget, **common
        )
        assert got[:3] == want[:3], (workers, chunk, budget)
        assert got[3]["workers"] == min(workers, got[3]["ranges"])
        if chunk < 8192:
            assert got[3]["ranges"] > 40
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == []  # spool parts and logs removed


def test_parallel_pass1_reports_the_same_errors_with_the_same_line_numbers(tmp_path: Path) -> None:
    """Bad lines in many ranges (and lines before the first that tells the format): the same error
    message, list (file line numbers), counts and truncation as the sequential scan; nothing stored."""
    rows: list[Any] = ["[1, 2]", "", "{broken", *chat_rows(600, seed=1)]
    rng = random.Random(7)
    bad = [
        '{"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "x"}]}',
        '{"messages": []}',
        "{not json",
        '{"messages": [{"role": "user", "content": "only a question"}]}',
        '{"prompt": "a", "completion": "b"}',
    ]
    for i in range(40):
        rows.insert(rng.randrange(3, len(rows)), bad[i % len(bad)])
    rows.append({"messages": [{"role": "user", "content": "x" * 900}, {"role": "assistant", "content": "y"}]})
    path = write_lines(tmp_path / "broken.jsonl", encoded(rows))
    for opts in ({"max_errors": 100}, {"max_errors": 7, "max_tokens": 400}):
        want = refusal(path, tmp_path, workers=1, **opts)
        assert want[1]["total"] > 40 and want[1]["errors"][0]["line"] == 1
        for workers, chunk in ((2, 2000), (4, 513)):
            got = refusal(path, tmp_path, workers=workers, chunk_bytes=chunk, **opts)
            assert got == want, (opts, workers, chunk)
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == []


def test_a_file_with_no_line_that_tells_the_format_is_refused_alike(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "none.jsonl", [b"[1]\n", b"\n", b"{}\n", b"{bad\n"])
    want = refusal(path, tmp_path, workers=1)
    assert refusal(path, tmp_path, workers=2, chunk_bytes=2) == want
    assert [e["line"] for e in want[1]["errors"]] == [1, 3, 4]


def test_pass1_stays_sequential_where_it_cannot_go_in_parallel(tmp_path: Path) -> None:
    """A stream that is not a file, a base model's tokenizer, or a small file by default: one scan."""
    lines = encoded(chat_rows(50))
    path = write_lines(tmp_path / "small.jsonl", lines)

    def workers(source: Any, opts: IngestOptions) -> int:
        ing = ingest(source, opts, tmp_path / "spool")
        ing.close()
        return int(ing.work["pass1"]["workers"])

    with open(path, "rb") as fh:
        assert workers(fh, IngestOptions()) == 1  # below PARALLEL_MIN_BYTES
    with open(path, "rb") as fh:
        assert workers(fh, IngestOptions(workers=2, chunk_bytes=1000)) == 2
    assert workers(io.BytesIO(b"".join(lines)), IngestOptions(workers=2)) == 1  # not a file
    with open(path, "rb") as fh:
        opts = IngestOptions(workers=2, count_tokens=lambda s: len(s.split()), tokenizer="words")
        assert workers(fh, opts) == 1
    assert parallel.worker_count(0, parallel.PARALLEL_MIN_BYTES - 1) == 1
    assert parallel.worker_count(3, 10) == 3
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == []


def test_range_edges_are_line_starts(tmp_path: Path) -> None:
    data = b"a\nbb\n\nccc\r\nlast-without-newline"
    path = write_lines(tmp_path / "f", [data])
    with open(path, "rb") as fh:
        for chunk in (1, 2, 3, 5, 100):
            edges = parallel.boundaries(fh.fileno(), 0, len(data), chunk)
            assert edges[0] == 0 and edges[-1] == len(data) and edges == sorted(set(edges))
            assert all(data[e - 1 : e] == b"\n" for e in edges[1:-1])
        assert parallel.boundaries(fh.fileno(), 0, len(data), 1) == [0, 2, 5, 6, 11, len(data)]


def test_worker_memory_does_not_grow_with_the_upload(tmp_path: Path) -> None:
    """What a worker holds is one range's rows; the parent's columns are bounded by the memory budget
    and the merge buffer by the window: the peak resident set of every process (parent and workers)
    is the same for a file four times the size. (The 1 GiB figure is in docs/benchmarks.md.)"""
    rng = random.Random(3)
    words = [f"w{i}" for i in range(300)]

    def row() -> bytes:
        q = " ".join(rng.choice(words) for _ in range(60))
        a = " ".join(rng.choice(words) for _ in range(90))
        doc = {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        return json.dumps(doc).encode() + b"\n"

    small = write_lines(tmp_path / "small.jsonl", [row() for _ in range(4_000)])
    large = write_lines(tmp_path / "large.jsonl", [row() for _ in range(16_000)])
    peaks = {}
    for name, path in (("small", small), ("large", large)):
        with open(path, "rb") as fh:
            ing = ingest(fh, IngestOptions(workers=2, chunk_bytes=256 << 10), tmp_path / "spool")
        how = ing.work["pass1"]
        ing.close()
        assert how["workers"] == 2 and how["ranges"] > 8
        peaks[name] = max(how["worker_max_rss"])
    assert peaks["large"] - peaks["small"] < 8 << 20, peaks
    assert peaks["large"] < 120 << 20, peaks


def test_a_workers_lines_are_the_lines_a_file_iterates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranges are read in blocks split at b"\\n" only, as iterating the file splits them (a lone CR,
    CRLF, a line longer than a block, a last line without newline)."""
    data = b"one\rstill one\ntwo\r\n\n" + b"x" * 50 + b"\n\r\n   \nlast"
    path = write_lines(tmp_path / "f", [data])
    with open(path, "rb") as fh:
        want = list(fh)
    for block in (1, 3, 7, 64, 1 << 20):
        monkeypatch.setattr(parallel, "READ_BUFFER", block)
        with open(path, "rb", buffering=0) as fh:
            assert list(parallel._lines_in(fh, len(data))) == want, block
        with open(path, "rb", buffering=0) as fh:  # a range that ends before the file does
            fh.seek(4)
            assert list(parallel._lines_in(fh, 16)) == [b"still one\n", b"two\r\n", b"\n"], block
