"""The one YAML loader refuses alias bombs and oversized documents wherever YAML is accepted."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from trainyard.cli.quote_cmd import quote_command
from trainyard.errors import PoolsFileError, SpecError
from trainyard.spec.loader import MAX_DOCUMENT_BYTES, load_spec_text, parse_document

# The "billion laughs": 9 levels of 9 aliases, a few hundred bytes that expand to 9^8 leaves.
ALIAS_BOMB = (
    "a: &a ["
    + ",".join(["lol"] * 9)
    + "]\n"
    + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)
    )
)


def test_the_bomb_is_small() -> None:
    assert len(ALIAS_BOMB.encode()) < 600


def test_alias_bomb_is_refused_before_it_expands() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as exc:
            load_spec_text(ALIAS_BOMB, "bomb.yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "anchors and aliases" in exc.value.message
    assert "\n" not in exc.value.message
    # Expanding it would take hundreds of MB; refusing it takes almost nothing.
    assert peak < 5 * 2**20, peak


@pytest.mark.parametrize(
    "doc", ["x: &anchor 1\ny: 2\n", "base: &b {k: 1}\nother:\n  <<: *b\n", "a: *missing\n"]
)
def test_any_anchor_or_alias_is_refused(doc: str) -> None:
    with pytest.raises(SpecError, match="malformed YAML"):
        parse_document(doc, "x.yaml")


def test_plain_yaml_and_json_still_parse() -> None:
    assert parse_document("a: [1, 2]\nb: {c: x}\n", "x.yaml") == {"a": [1, 2], "b": {"c": "x"}}
    assert parse_document('{"a": 1}', "x.json") == {"a": 1}
    # a `&` or `*` inside a quoted string is not an anchor
    assert parse_document("cmd: '&x *y'\n", "x.yaml") == {"cmd": "&x *y"}


def test_oversized_document_is_refused_without_parsing() -> None:
    big = "name: x\n" + "# padding\n" * (MAX_DOCUMENT_BYTES // 10 + 1)
    with pytest.raises(SpecError, match="document too large"):
        parse_document(big, "big.yaml")
    # multi-byte characters count as bytes, not characters
    wide = "name: '" + "é" * (MAX_DOCUMENT_BYTES // 2 + 10) + "'\n"
    assert len(wide) < MAX_DOCUMENT_BYTES
    with pytest.raises(SpecError, match="document too large"):
        parse_document(wide, "wide.yaml")


def test_pools_file_with_aliases_is_refused(tmp_path: Path) -> None:
    from trainyard.catalog.pools import load_pools

    p = tmp_path / "pools.yaml"
    p.write_text(ALIAS_BOMB)
    with pytest.raises((PoolsFileError, SpecError), match="anchors and aliases"):
        load_pools(p)


def test_cli_quote_refuses_the_bomb_with_one_line_and_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "bomb.yaml"
    spec.write_text(ALIAS_BOMB)
    app = typer.Typer()
    app.command()(quote_command)
    r = CliRunner().invoke(app, [str(spec)])
    assert r.exit_code == 2, r.output
    assert "anchors and aliases" in r.output and "hint:" in r.output
    assert "Traceback" not in r.output
