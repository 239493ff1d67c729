"""Dataset ingestion: every format valid and broken, content addresses, split stability, leakage."""

from __future__ import annotations

import hashlib
import io
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainyard.datasets import minhash
from trainyard.datasets.formats import canonical_json
from trainyard.datasets.ingest import Ingested, IngestOptions, ingest
from trainyard.errors import InvalidDatasetError, PayloadTooLargeError

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
]


def lines(rows: list[Any]) -> io.BytesIO:
    out = []
    for r in rows:
        out.append((r if isinstance(r, str) else json.dumps(r)).encode() + b"\n")
    return io.BytesIO(b"".join(out))


def sentence(rng: random.Random, n: int = 20) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(1000)) for _ in range(n))


def chat_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "messages": [
                {"role": "system", "content": "You are a helpful assistant. Réponds en français."},
                {"role": "user", "content": f"q{i}: {sentence(rng)}"},
                {"role": "assistant", "content": f"a{i}: {sentence(rng, 8)}"},
            ]
        }
        for i in range(n)
    ]


def run(rows: list[Any], tmp: Path, **opts: Any) -> Ingested:
    return ingest(lines(rows), IngestOptions(**opts), tmp / "spool")


def split_rows(ing: Ingested, tmp: Path, name: str = "out") -> dict[str, list[dict[str, Any]]]:
    ing.write(f"file://{tmp}/{name}")
    return {
        s: [json.loads(x) for x in (tmp / name / f"{s}.jsonl").read_text().splitlines()]
        for s in ("train", "eval")
    }


@pytest.mark.parametrize(
    ("fmt", "rows"),
    [
        ("text", ["plain line one", {"text": "a json text row"}, "café"]),
        ("completion", [{"prompt": "2+2=", "completion": "4"}, {"prompt": "", "completion": "hello"}]),
        ("chat", chat_rows(3)),
    ],
)
def test_each_format_is_detected_and_stored(fmt: str, rows: list[Any], tmp_path: Path) -> None:
    ing = run(rows, tmp_path, eval_fraction=0.0)
    assert ing.format == fmt
    assert ing.rows == len(rows) and ing.duplicates_removed == 0
    out = split_rows(ing, tmp_path)
    assert len(out["train"]) == len(rows) and out["eval"] == []
    # files are canonical JSON lines sorted by row hash, and the split sha256 is the file's sha256sum
    raw = (tmp_path / "out" / "train.jsonl").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == ing.train.sha256
    row_lines = raw.splitlines(keepends=True)
    assert row_lines == sorted(row_lines, key=lambda b: hashlib.sha256(b).digest())
    for line in row_lines:
        assert line.decode() == canonical_json(json.loads(line)) + "\n"
    ing.close()


BROKEN: dict[str, tuple[str, list[Any], dict[int, str]]] = {
    "completion": (
        "completion",
        [
            {"prompt": "ok", "completion": "fine"},
            '{"prompt": "no closing brace"',
            {"prompt": "missing completion"},
            {"prompt": "p", "completion": ""},
            {"prompt": 3, "completion": "x"},
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]},
            "[1, 2]",
        ],
        {
            2: "bad_json",
            3: "missing_field",
            4: "empty_content",
            5: "wrong_type",
            6: "wrong_format",
            7: "data_type",
        },
    ),
    "chat": (
        "chat",
        [
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            {"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "x"}]},
            {"messages": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "x"}]},
            {"messages": [{"role": "user", "content": "only a question"}]},
            {"messages": [{"content": "no role"}, {"role": "assistant", "content": "x"}]},
            {"messages": "not a list"},
            {"messages": []},
            "{not json",
        ],
        {
            2: "unknown_role",
            3: "empty_content",
            4: "no_assistant_turn",
            5: "missing_field",
            6: "wrong_type",
            7: "empty_content",
            8: "bad_json",
        },
    ),
    "text": (
        "text",
        ["fine", {"text": ""}, {"text": 5}, '{"text": broken'],
        {2: "empty_content", 3: "wrong_type", 4: "bad_json"},
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_every_bad_line_is_listed_and_nothing_is_spooled(case: str, tmp_path: Path) -> None:
    fmt, rows, expected = BROKEN[case]
    with pytest.raises(InvalidDatasetError) as info:
        run(rows, tmp_path, format=fmt)
    err = info.value
    assert err.code == "invalid_dataset" and err.http_status == 422
    got = {e["line"]: e["kind"] for e in err.details["errors"]}
    assert got == expected
    assert all(e["message"] for e in err.details["errors"])
    assert err.details["total"] == len(expected)
    assert sum(err.details["counts"].values()) == len(expected)
    assert list((tmp_path / "spool").iterdir()) == []  # the spool is removed


def test_error_list_is_capped_but_every_error_is_counted(tmp_path: Path) -> None:
    rows = [{"prompt": "p"}] * 50 + [{"prompt": "p", "completion": "c"}]
    with pytest.raises(InvalidDatasetError) as info:
        run(rows, tmp_path, max_errors=10)
    d = info.value.details
    assert len(d["errors"]) == 10 and d["total"] == 50 and d["truncated"] is True
    assert [e["line"] for e in d["errors"]] == list(range(1, 11))


def test_rows_longer_than_the_context_are_errors(tmp_path: Path) -> None:
    rows = [{"prompt": "short", "completion": "ok"}, {"prompt": "x" * 500, "completion": "long"}]
    with pytest.raises(InvalidDatasetError) as info:
        run(rows, tmp_path, max_tokens=100)
    assert [(e["line"], e["kind"]) for e in info.value.details["errors"]] == [(2, "too_long")]


def test_size_limit_is_enforced_while_streaming(tmp_path: Path) -> None:
    with pytest.raises(PayloadTooLargeError):
        run(["x" * 100] * 100, tmp_path, max_bytes=5000)
    assert list((tmp_path / "spool").iterdir()) == []


def test_same_content_in_another_order_and_formatting_has_the_same_id(tmp_path: Path) -> None:
    rows = chat_rows(300)
    a = run(rows, tmp_path)
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    # other key order, other spacing, escaped unicode, NFD instead of NFC, exact duplicates
    reformatted = [
        json.dumps(
            {"messages": [dict(reversed(list(m.items()))) for m in r["messages"]]},
            ensure_ascii=True,
            separators=(" ,  ", " : "),
        )
        for r in shuffled
    ]
    b = run([*reformatted, *reformatted[:17]], tmp_path)
    assert b.sha256 == a.sha256
    assert b.duplicates_removed == 17 and b.rows == a.rows == 300
    sa, sb = split_rows(a, tmp_path, "a"), split_rows(b, tmp_path, "b")
    assert sa == sb and a.train.sha256 == b.train.sha256 and a.eval.sha256 == b.eval.sha256
    c = run(rows[:-1], tmp_path)
    assert c.sha256 != a.sha256
    nfc = run([{"text": "caf\u00e9"}], tmp_path)
    nfd = run([{"text": "cafe\u0301"}], tmp_path)
    assert nfc.sha256 == nfd.sha256


def test_split_is_stable_across_versions(tmp_path: Path) -> None:
    """A row lands on the same side whatever else the version holds (rows without near-duplicates)."""
    rows = chat_rows(600, seed=3)
    v1 = split_rows(run(rows[:400], tmp_path, eval_fraction=0.2), tmp_path, "v1")
    v2 = split_rows(run(rows[200:], tmp_path, eval_fraction=0.2), tmp_path, "v2")

    def side(out: dict[str, list[Any]]) -> dict[str, str]:
        return {canonical_json(r): s for s in out for r in out[s]}

    s1, s2 = side(v1), side(v2)
    common = set(s1) & set(s2)
    assert len(common) == 200
    assert all(s1[k] == s2[k] for k in common)
    assert 0.1 < len(v1["eval"]) / 400 < 0.3  # about eval_fraction
    other_seed = side(split_rows(run(rows[:400], tmp_path, eval_fraction=0.2, seed=7), tmp_path, "v3"))
    assert any(other_seed[k] != s1[k] for k in s1)


def test_near_duplicates_never_straddle_the_split(tmp_path: Path) -> None:
    rng = random.Random(5)
    base = [sentence(rng, 40) for _ in range(150)]
    rows = []
    for i, b in enumerate(base):
        words = b.split()
        for v in range(3):  # three paraphrases that differ in one word each
            w = words[:]
            w[(7 * v + i) % len(w)] = f"changed{v}"
            rows.append({"prompt": " ".join(w), "completion": f"answer {i} {v}"})
    ing = run(rows, tmp_path, eval_fraction=0.3)
    out = split_rows(ing, tmp_path)
    assert out["eval"], "some clusters should be held out"
    assert ing.near_duplicates_kept_in_train > 0
    family = {r["prompt"]: int(r["completion"].split()[1]) for s in out.values() for r in s}
    train_families = {family[r["prompt"]] for r in out["train"]}
    eval_families = {family[r["prompt"]] for r in out["eval"]}
    assert not train_families & eval_families
    # without the MinHash step, hashing prompts alone would have leaked: the rule is doing the work
    hashed_eval_prompts = set()
    for fam in range(150):
        sides = {
            ing_side for ing_side in (_hash_side(r["prompt"], 0.3, 0) for r in rows[fam * 3 : fam * 3 + 3])
        }
        if len(sides) > 1:
            hashed_eval_prompts.add(fam)
    assert hashed_eval_prompts


def _hash_side(key: str, fraction: float, seed: int) -> bool:
    h = hashlib.sha256(f"trainyard-split/{seed}\n".encode() + key.encode()).digest()[:8]
    return int.from_bytes(h, "little") % 10_000 < round(fraction * 10_000)


def test_minhash_estimates_jaccard_and_clusters_transitively() -> None:
    rng = random.Random(2)
    a = sentence(rng, 60)
    b = a.replace(a.split()[10], "different", 1)
    c = sentence(rng, 60)
    assert minhash.estimate_jaccard(a, b) > 0.8
    assert minhash.estimate_jaccard(a, c) < 0.2
    assert minhash.estimate_jaccard("Hello   World", "hello world") == 1.0
    labels = minhash.clusters(minhash.band_keys([a, b, c, "", ""]))
    assert labels[0] == labels[1] != labels[2]
    assert labels[3] == labels[4]


FAST_CASES: dict[str, list[Any]] = {
    "chat": [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "Réponds"},
                      {"role": "assistant", "content": "Oui"}, {"role": "user", "content": "more"},
                      {"role": "assistant", "content": "done"}]},
        {"messages": [{"role": "user", "content": "Cafe\u0301"}, {"role": "assistant", "content": "x"}]},
        {"messages": [{"role": "user", "content": "a", "name": "bob"},
                      {"role": "assistant", "content": "b"}]},
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": 0}]},
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "id": 7},
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "user", "content": "trailing question"}]},
    ],
    "completion": [
        {"prompt": "p", "completion": "c"},
        {"prompt": "", "completion": "only the answer"},
        {"prompt": "e\u0301", "completion": "c"},
        {"prompt": "p", "completion": "c", "meta": 1},
    ],
    "text": ["a plain line", {"text": "json text"}, "e\u0301t\u0301e\u0301", {"text": "t", "source": "x"}],
}  # fmt: skip


@pytest.mark.parametrize("fmt", sorted(FAST_CASES))
def test_the_fast_path_agrees_with_the_validating_path(fmt: str) -> None:
    """Rows already in canonical shape skip normalisation; whatever the fast path accepts must give the
    bytes, split key and tokens that normalising gives, and it must hand every other row over."""
    from trainyard.datasets.formats import FAST, byte_count, canonical_bytes, normalize, token_count

    accepted = []
    for obj in FAST_CASES[fmt]:
        row, key = normalize(obj, fmt)
        expected = (canonical_bytes(row) + b"\n", key, token_count(row, byte_count))
        for count in (byte_count, lambda s: len(s.split())):
            got = FAST[fmt](obj, count)
            if got is not None:
                assert got == (expected[0], expected[1], token_count(row, count))
        got = FAST[fmt](obj, byte_count)
        if got is not None:  # it only takes rows that normalising leaves as they are
            assert canonical_bytes(obj if isinstance(obj, dict) else {"text": obj}) == canonical_bytes(row)
        accepted.append(got is not None)
    # the plain rows (listed first) take the fast path; NFD text and extra keys do not
    assert (
        accepted
        == {
            "chat": [True, True, False, False, False, False, True],
            "completion": [True, True, False, False],
            "text": [True, True, False, False],
        }[fmt]
    )


def test_densify_fills_each_empty_bin_from_the_next_non_empty_bin_to_its_right() -> None:
    rng = random.Random(4)
    n_rows = 40
    sig = np.full(n_rows * minhash.N_BINS, minhash._EMPTY, dtype=np.uint64)
    for r in range(n_rows - 2):  # the last two rows stay empty
        for j in rng.sample(range(minhash.N_BINS), rng.randint(1, minhash.N_BINS)):
            sig[r * minhash.N_BINS + j] = rng.randrange(2**58)
    out = minhash._densify(sig.copy()).reshape(n_rows, minhash.N_BINS)
    grid = sig.reshape(n_rows, minhash.N_BINS)
    for r in range(n_rows):
        for j in range(minhash.N_BINS):
            if grid[r, j] != minhash._EMPTY:
                assert out[r, j] == grid[r, j]
                continue
            dist = next(
                (d for d in range(1, minhash.N_BINS) if grid[r, (j + d) % minhash.N_BINS] != minhash._EMPTY),
                None,
            )
            if dist is None:
                assert out[r, j] == minhash._EMPTY
            else:
                want = (int(grid[r, (j + dist) % minhash.N_BINS]) + dist * 0x9E3779B1) % 2**64
                assert int(out[r, j]) == want


def test_clusters_are_the_connected_components_of_shared_band_keys() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(2, 300))
        bands = rng.integers(0, int(rng.integers(2, 400)), size=(n, 16)).astype(np.uint32)
        parent = list(range(n))

        def find(i: int, parent: list[int] = parent) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for b in range(16):
            first: dict[int, int] = {}
            for i, k in enumerate(bands[:, b].tolist()):
                if k in first:
                    ra, rb = find(i), find(first[k])
                    parent[max(ra, rb)] = min(ra, rb)
                else:
                    first[k] = i
        want = [min(j for j in range(n) if find(j) == find(i)) for i in range(n)]
        assert minhash.clusters(bands).tolist() == want


def near_duplicate_rows(families: int, seed: int) -> list[dict[str, Any]]:
    """Chat rows in families of three paraphrases (one word changed each), some exact duplicates."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for i in range(families):
        words = sentence(rng, 30).split()
        for v in range(3):
            w = words[:]
            w[(5 * v + i) % len(w)] = f"changed{v}"
            rows.append(
                {
                    "messages": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": " ".join(w)},
                        {"role": "assistant", "content": f"answer {i} {v}"},
                    ]
                }
            )
    rows += rng.sample(rows, len(rows) // 20)  # exact duplicates, anywhere
    rng.shuffle(rows)
    return rows


def test_spilled_multi_pass_ingestion_gives_the_same_version_as_in_memory(tmp_path: Path) -> None:
    """With a memory budget far below the dataset's per-row state, the columns are spilled to files and
    pass 2 goes in several passes (hash-prefix ranges, band-key ranges, links joined as they come): the
    content address, split, files and counts are exactly the in-memory path's."""
    rows = near_duplicate_rows(1200, seed=9)
    outcomes = {}
    for budget in (64 << 20, 256 << 10, 64 << 10):
        ing = run(rows, tmp_path, eval_fraction=0.3, memory_budget=budget)
        work = dict(ing.work)
        name = f"b{budget}"
        ing.write(f"file://{tmp_path}/{name}")
        files = {s: (tmp_path / name / f"{s}.jsonl").read_bytes() for s in ("train", "eval")}
        manifest = (tmp_path / name / "manifest.json").read_bytes()
        outcomes[budget] = (ing.sha256, ing.split_key, manifest, files, work)
        ing.close()
    in_memory = outcomes[64 << 20]
    assert {k: in_memory[4][k] for k in ("spilled", "dedupe_passes", "band_passes")} == {
        "spilled": False,
        "dedupe_passes": 1,
        "band_passes": 1,
    }
    smallest = outcomes[64 << 10][4]
    assert smallest["spilled"] and smallest["dedupe_passes"] > 4 and smallest["band_passes"] > 1
    assert outcomes[256 << 10][4]["spilled"]
    for budget, got in outcomes.items():
        assert got[:4] == in_memory[:4], budget
    doc = json.loads(in_memory[2])
    assert doc["duplicates_removed"] == len(rows) - 3600 > 0 and doc["rows"] == 3600
    assert doc["near_duplicates_kept_in_train"] > 0 and in_memory[3]["eval"]
    # no family straddles the split, whichever path made it
    fam = {
        s: {json.loads(x)["messages"][2]["content"].split()[1] for x in b.splitlines()}
        for s, b in in_memory[3].items()
    }
    assert not fam["train"] & fam["eval"]
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == []  # spool and work files removed


def test_spilled_path_removes_its_files_when_the_upload_is_rejected(tmp_path: Path) -> None:
    """A bad line after the first batches were spilled: the error is reported, and the spool and the
    spilled columns are removed."""
    rows: list[Any] = [*near_duplicate_rows(1000, seed=2), {"messages": []}]
    with pytest.raises(InvalidDatasetError) as info:
        run(rows, tmp_path, memory_budget=64 << 10)
    assert [(e["line"], e["kind"]) for e in info.value.details["errors"]] == [(len(rows), "empty_content")]
    assert list((tmp_path / "spool").iterdir()) == []
