"""benchmarks/mutation_remap.py: equivalent mutants follow their change when an edit renumbers them."""

from __future__ import annotations

import importlib.util
import json
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mutation_remap", ROOT / "benchmarks" / "mutation_remap.py")
assert _spec is not None and _spec.loader is not None
mr = importlib.util.module_from_spec(_spec)
sys.modules["mutation_remap"] = mr
_spec.loader.exec_module(mr)

OLD = """
def price(hours, rate):
    if hours <= 0:
        return 0.0
    return hours * rate


class Pool:
    def free(self, used):
        return self.size - used
"""

# a statement inserted at the top of ``price`` (new mutants before the old ones), one line edited
NEW = """
def price(hours, rate):
    floor = 1.0
    if hours <= 0:
        return 0.0
    return max(hours, floor) * rate


class Pool:
    def free(self, used):
        return self.size - used
"""


def test_names_and_order_are_mutmuts_own() -> None:
    for source in (OLD, NEW):
        sig = mr.signatures(source, "m.py", check=True)  # raises if the names differ from mutmut's
        assert sig and all(k.startswith(("x_price__mutmut_", "xǁPoolǁfree__mutmut_")) for k in sig)


def test_a_mutant_keeps_its_change_across_an_edit_that_renumbers_it() -> None:
    old, new = mr.signatures(OLD, "m.py"), mr.signatures(NEW, "m.py")
    # the mutant that turns `hours <= 0` into `hours < 0`
    (before,) = [k for k, s in old.items() if s[1] == "hours<=0" and s[3] == "<0"]
    (after,) = [k for k, s in new.items() if s[1] == "hours<=0" and s[3] == "<0"]
    assert before != after  # the inserted statement's mutants come first
    # the one that turns the last line's `*` into `/` is on an edited line: its change is gone
    (edited,) = [k for k, s in old.items() if s[3] == "hours/rate"]
    method = next(k for k in old if k.startswith("xǁPoolǁfree"))
    names = [f"m.{before}", f"m.{edited}", f"m.{method}"]
    result = mr.remap(OLD, NEW, "m", names)
    assert result.renamed == {f"m.{before}": f"m.{after}"}
    assert result.kept == [f"m.{method}"]  # another function's numbers do not move
    assert result.lost == [f"m.{edited}"]


def test_applying_a_remap_renames_in_place_and_drops_what_is_lost() -> None:
    result = mr.Remap(
        renamed={"m.x_a__mutmut_2": "m.x_a__mutmut_5"}, kept=["m.x_b__mutmut_1"], lost=["m.x_a__mutmut_3"]
    )
    equivalent = {
        "m.x_b__mutmut_1": "b's reason",
        "m.x_a__mutmut_2": "a's reason",
        "m.x_a__mutmut_3": "gone",
        "other.x_c__mutmut_1": "untouched",
    }
    out = mr.apply(equivalent, result)
    assert list(out.items()) == [
        ("m.x_b__mutmut_1", "b's reason"),
        ("m.x_a__mutmut_5", "a's reason"),
        ("other.x_c__mutmut_1", "untouched"),
    ]
    with pytest.raises(RuntimeError):
        mr.apply({"m.x_a__mutmut_2": "r", "m.x_a__mutmut_5": "s"}, result)  # two onto one


def test_every_recorded_equivalent_names_a_mutant_of_a_mutated_module() -> None:
    """A name left behind by an edit (a function renamed or removed, fewer mutants than its number) or a
    module no longer mutated is caught here; mutation_remap.py is how to carry the names across."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    equivalent = json.loads((ROOT / "benchmarks" / "data" / "mutation_equivalent.json").read_text())
    modules = {mr.module_name(p): p for p in config["only_mutate"]}
    unknown = [k for k in equivalent if mr.module_of(k) not in modules]
    assert unknown == []
    missing = []
    for mod, path in modules.items():
        names = [k for k in equivalent if mr.module_of(k) == mod]
        if names:
            made = mr.signatures((ROOT / path).read_text(), path)
            missing += [k for k in names if k.removeprefix(mod + ".") not in made]
    assert missing == []


def test_the_recorded_equivalents_of_the_cost_model_are_its_mutants_now() -> None:
    """The file names mutants that exist: each one of cost/model.py maps onto itself."""
    equivalent = json.loads((ROOT / "benchmarks" / "data" / "mutation_equivalent.json").read_text())
    names = [k for k in equivalent if k.startswith("trainyard.cost.model.x")]
    source = (ROOT / "src" / "trainyard" / "cost" / "model.py").read_text()
    result = mr.remap(source, source, "trainyard.cost.model", names)
    assert names and result.kept == names and not result.renamed and not result.lost


def test_a_statement_the_formatter_lays_out_again_keeps_its_mutants() -> None:
    old = "def f(hours, rate):\n    return hours * rate if hours > 1 else rate\n"
    new = (
        "def f(hours, rate):\n"
        "    with open('x'):  # a new block around the old body\n"
        "        return (\n"
        "            hours * rate  # the product\n"
        "            if hours > 1\n"
        "            else rate\n"
        "        )\n"
    )
    names = [f"m.{k}" for k in mr.signatures(old, "m.py")]
    assert len(names) >= 3
    result = mr.remap(old, new, "m", names)
    assert not result.lost and len(result.kept) + len(result.renamed) == len(names)
