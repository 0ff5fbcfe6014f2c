"""Run by the installed interpreter: does the package import, and declare what it imports?

Prints one JSON object: ``unimportable`` (module -> error) for every module of the installed
``extproc`` package that fails to import, and ``undeclared`` (top-level import -> where) for
every third-party import whose distribution is not among the package's declared dependencies
(an optional extra's, e.g. ``kubernetes`` for auth-provider kubeconfigs, counts when it is not
installed: every module must still import without it). An import made only inside a function
(uvloop's, say) counts too: the AST, not the import, finds them.
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import sys
from importlib import metadata
from pathlib import Path


def declared(*, optional: bool = False) -> set[str]:
    """The normalised names of the package's dependencies: without extras, or (``optional``)
    those of its extras other than ``dev``."""
    names = set()
    for requirement in metadata.requires("modelpool-extproc") or []:
        extra = re.search(r"extra == ['\"]([^'\"]+)", requirement)
        if bool(extra) != optional or (extra and extra.group(1) == "dev"):
            continue
        names.add(normalise(re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0]))
    return names


def normalise(name: str) -> str:
    """PEP 503's normalised form of a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_levels(root: Path) -> dict[str, str]:
    """Every absolute top-level module imported under ``root`` -> the first file importing it."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(root.parent)))
    return found


def main() -> None:
    """Import everything, then compare the imports with the declared dependencies."""
    import extproc

    root = Path(extproc.__file__).parent
    unimportable = {}
    for module in pkgutil.walk_packages([str(root)], "extproc."):
        if module.name.endswith(".__main__"):
            continue  # (runs the command line: its imports are cli's, checked below)
        try:
            importlib.import_module(module.name)
        except Exception as exc:  # (reported, not raised: every failure is listed at once)
            unimportable[module.name] = f"{type(exc).__name__}: {exc}"
    providers = metadata.packages_distributions()
    wanted, optional = declared(), declared(optional=True)
    undeclared = {}
    for top, where in sorted(imported_top_levels(root).items()):
        if top == "extproc" or top in sys.stdlib_module_names:
            continue
        dists = {normalise(d) for d in providers.get(top, [])} or {normalise(top)}
        if not dists & (wanted | optional):
            undeclared[top] = f"{where} (provided by: {sorted(dists) or 'nothing installed'})"
    print(json.dumps({"unimportable": unimportable, "undeclared": undeclared,
                      "declared": sorted(wanted), "optional": sorted(optional)}))


if __name__ == "__main__":
    main()
