"""The shape of the policy package, checked from its source: imports and who writes the machine.

* The imports of ``extproc`` form no circle, ``TYPE_CHECKING`` imports included: every
  concern of the policy types against ``pool.PoolReader``, never against the machine.
* No module of ``extproc/policy`` but ``machine.py`` assigns an attribute of the machine
  (``m.x = ...``, ``m.x[k] = ...``, ``m.room.x += ...``): a concern changes the dataclass it
  is handed, an edge calls the machine's methods (``pool.PoolWriter``).
* ``PoolMachine`` has every member the two protocols promise.
"""

from __future__ import annotations

import ast
from pathlib import Path

from extproc.policy.machine import PoolMachine
from extproc.policy.model import PoolKey, PoolSpec
from extproc.policy.pool import PoolWriter
from harness import limits

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "extproc"
MACHINE_NAMES = ("m", "machine")  # what concerns call the machine they are handed


def module_name(path: Path) -> str:
    """``extproc/policy/swap.py`` -> ``extproc.policy.swap`` (a package is its __init__)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports, wherever the import statement is."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = f"{base}.{node.module}" if node.level and node.module else \
                base if node.level else node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)  # from . import x
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    """Every module of ``extproc`` -> the modules of ``extproc`` it imports."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of imports in ``graph`` (empty if there is none)."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str]:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return []
        for nxt in sorted(graph[node]):
            if cycle := visit(nxt, path + [node]):
                return cycle
        done.add(node)
        return []

    for start in sorted(graph):
        if cycle := visit(start, []):
            return cycle
    return []


def test_the_imports_of_extproc_form_no_circle() -> None:
    graph = import_graph()
    assert "extproc.policy.pool" in graph["extproc.policy.modes"]  # the graph sees imports
    assert find_cycle(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def machine_writes(path: Path) -> list[str]:
    """Assignments in ``path`` to an attribute of the machine a function was handed."""
    writes = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = list(node.targets) if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        while targets:
            target = targets.pop()
            if isinstance(target, (ast.Tuple, ast.List)):
                targets.extend(target.elts)  # (a, m.x = ...)
                continue
            root = target  # m.x, m.x[k], m.room.x: all rooted at the machine
            while isinstance(root, (ast.Subscript, ast.Attribute)):
                root = root.value
            if target is not root and isinstance(root, ast.Name) and root.id in MACHINE_NAMES:
                writes.append(f"{path.name}:{node.lineno} {ast.unparse(target)}")
    return writes


def test_only_the_machine_assigns_its_attributes() -> None:
    policy = PACKAGE / "policy"
    writes = [w for p in sorted(policy.glob("*.py")) if p.name != "machine.py"
              for w in machine_writes(p)]
    assert writes == []


def test_the_write_check_sees_a_write(tmp_path: Path) -> None:
    path = tmp_path / "concern.py"
    path.write_text("def f(m):\n    m.resident = ''\n    m.failed_until['a'] += 1\n"
                    "    a, m.b = 1, 2\n    m.fleet.drain = (0, '')\n")
    assert [w.split()[1] for w in machine_writes(path)] == [
        "m.resident", "m.failed_until['a']", "m.b", "m.fleet.drain"]


def test_the_machine_has_what_the_protocols_promise() -> None:
    machine = PoolMachine(PoolSpec(PoolKey("ns", "pool"), ("a", "b")), limits(), 0.0)
    promised = {name for cls in PoolWriter.__mro__ if cls.__module__.endswith(".pool")
                for name in [*vars(cls), *getattr(cls, "__annotations__", {})]
                if not name.startswith("_")}
    assert promised and all(hasattr(machine, name) for name in promised)
