"""Carry the mutants written down as equivalent across a change to their module's source.

mutmut names a mutant by its function and its position among that function's mutants
(``trainyard.schedule.round.x_schedule_round__mutmut_87``), so an edit anywhere in a function renumbers
the mutants after it, and ``benchmarks/data/mutation_equivalent.json`` would name other mutants than the
ones whose reasons it gives. This script generates the mutants of the module at a base revision and in the
working tree (mutmut's own generator; no test is run), identifies each by what it changes (the function,
the statement holding the node it replaces, that node, the node as the mutant writes it, and which
occurrence of that change in the function it is; code compared without comments, whitespace or
parentheses, so a statement the formatter lays out again is still the same), and renames
each recorded equivalent to the mutant that makes the same change now. A recorded mutant whose change no
longer exists (its line was edited or removed) is listed to be examined again and, with ``--write``,
dropped from the file.

    python benchmarks/mutation_remap.py --base main            # report
    python benchmarks/mutation_remap.py --base main --write    # rewrite the equivalents file
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from mutation_score import module_of  # noqa: E402

EQUIVALENT = ROOT / "benchmarks" / "data" / "mutation_equivalent.json"

Signature = tuple[str, str, str, str, int]


def module_name(path: str) -> str:
    """``src/trainyard/cost/model.py`` -> ``trainyard.cost.model``."""
    return path.removeprefix("src/").removesuffix(".py").replace("/", ".")


def _normalised(code: str) -> str:
    """Code without comments, whitespace or parentheses: the same statement however it is laid out."""
    return re.sub(r"[\s()]+", "", re.sub(r"#[^\n]*", "", code))


def signatures(source: str, filename: str = "module.py", *, check: bool = False) -> dict[str, Signature]:
    """Each mutant of ``source`` (by mutmut's name without the module prefix, such as
    ``x_fn__mutmut_3``) and what it changes: (function, the statement holding the mutated node, that
    node, the node as the mutant writes it, which occurrence of that change in the function it is), the
    code compared without comments, whitespace or parentheses, so a reformatted statement is the same.
    ``check``: compare the names with those of mutmut's own generator (which renders every mutant: slow)."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, ParentNodeProvider
    from mutmut.mutation.file_mutation import (
        combine_mutations_to_source,
        create_mutations,
        group_by_top_level_node,
    )
    from mutmut.mutation.trampoline_templates import mangle_function_name

    module, mutations, ignored_classes, ignored_functions = create_mutations(filename, source)
    parents = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)

    def context(node: cst.CSTNode) -> cst.CSTNode:
        """The simple statement holding ``node``, or the part of a compound statement's header."""
        while not isinstance(node, cst.BaseSmallStatement):
            parent = parents.get(node)
            if parent is None or isinstance(parent, cst.BaseCompoundStatement):
                return node
            node = parent
        return node

    def text(node: cst.CSTNode) -> str:
        return _normalised(module.code_for_node(node))

    grouped = group_by_top_level_node(mutations)
    functions: list[tuple[cst.FunctionDef, str | None]] = []
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            functions.append((statement, None))
        elif isinstance(statement, cst.ClassDef) and isinstance(statement.body, cst.IndentedBlock):
            functions.extend(
                (m, statement.name.value) for m in statement.body.body if isinstance(m, cst.FunctionDef)
            )
    out: dict[str, Signature] = {}
    for func, class_name in functions:
        func_mutants = grouped.get(func)
        if not func_mutants:
            continue
        mangled = mangle_function_name(name=func.name.value, class_name=class_name)
        seen: Counter[tuple[str, str, str]] = Counter()
        for i, mutant in enumerate(func_mutants):
            change = (
                text(context(mutant.original_node)),
                text(mutant.original_node),
                text(mutant.mutated_node),
            )
            seen[change] += 1
            out[f"{mangled}__mutmut_{i + 1}"] = (mangled, *change, seen[change])
    if not check:
        return out
    generated = combine_mutations_to_source(
        module, mutations, ignored_classes, ignored_functions
    ).mutant_names
    if list(generated) != list(out):
        raise RuntimeError(f"{filename}: mutant names differ from mutmut's ({len(generated)} vs {len(out)})")
    return out


@dataclass(frozen=True)
class Remap:
    renamed: dict[str, str]  # old full name -> new full name (only those whose number moved)
    kept: list[str]  # same name, same change
    lost: list[str]  # the change no longer exists


def remap(old_source: str, new_source: str, module: str, names: Iterable[str]) -> Remap:
    """Where each of ``names`` (full mutant names of ``module``) is in ``new_source``."""
    old = signatures(old_source, module)
    new_by_sig = {sig: name for name, sig in signatures(new_source, module).items()}
    renamed, kept, lost = {}, [], []
    prefix = module + "."
    for full in names:
        sig = old.get(full.removeprefix(prefix))
        target = None if sig is None else new_by_sig.get(sig)
        if target is None:
            lost.append(full)
        elif prefix + target == full:
            kept.append(full)
        else:
            renamed[full] = prefix + target
    return Remap(renamed, kept, lost)


def apply(equivalent: Mapping[str, str], result: Remap) -> dict[str, str]:
    """The equivalents with ``result``'s renames applied and its lost mutants dropped, in their order."""
    lost = set(result.lost)
    kept = [(result.renamed.get(k, k), v) for k, v in equivalent.items() if k not in lost]
    out = dict(kept)
    if len(out) != len(kept):
        raise RuntimeError("two recorded mutants were mapped to the same new mutant")
    return out


def _git_show(rev: str, path: str) -> str | None:
    proc = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return proc.stdout if proc.returncode == 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the revision the equivalents were recorded against")
    ap.add_argument("--write", action="store_true", help="rewrite benchmarks/data/mutation_equivalent.json")
    args = ap.parse_args()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    equivalent: dict[str, str] = json.loads(EQUIVALENT.read_text())
    lost_any = False
    for path in config["only_mutate"]:
        mod = module_name(path)
        names = [k for k in equivalent if module_of(k) == mod]
        old = _git_show(args.base, path)
        new = (ROOT / path).read_text()
        if not names or old is None or old == new:
            continue
        result = remap(old, new, mod, names)
        print(f"{mod}: {len(result.kept)} kept, {len(result.renamed)} renumbered, {len(result.lost)} lost")
        for a, b in result.renamed.items():
            print(f"  {a} -> {b.rpartition('.')[2]}")
        for name in result.lost:
            lost_any = True
            print(f"  lost (examine again): {name}   reason was: {equivalent[name]}")
        equivalent = apply(equivalent, result)
    if args.write:
        EQUIVALENT.write_text(json.dumps(equivalent, indent=1, ensure_ascii=False) + "\n")
    return 1 if lost_any and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
