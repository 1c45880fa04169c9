"""The house's floors (../shared/DESIGN.md): every module imports only from its own floor or lower ones, lazy
imports inside functions included, and the package's imports form no cycle."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autoflash"

# Module (or package prefix) -> floor; a module takes the floor of its longest matching prefix.
FLOORS = {
    "autoflash._version": 1, "autoflash.problem": 1, "autoflash.gpu": 1, "autoflash.resources": 1,
    "autoflash.launch": 1, "autoflash.graphs": 1, "autoflash.checks": 1, "autoflash.mask_mod": 1, "autoflash.score_mod": 1,
    "autoflash.reference": 1,
    "autoflash.shapes": 1,
    "autoflash.tune.timing": 1,
    "autoflash.knobs": 2, "autoflash.families": 2,
    "autoflash.codegen": 3, "autoflash.db": 3,
    "autoflash.dispatch": 4, "autoflash.export": 4,
    "autoflash.api": 5, "autoflash.integrations": 5, "autoflash.distributed": 5, "autoflash.tune": 5,
    "autoflash.bench": 5, "autoflash": 5,
    "autoflash.cli": 6, "autoflash.__main__": 6,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str) -> int:
    prefixes = [p for p in FLOORS if module == p or module.startswith(p + ".")]
    return FLOORS[max(prefixes, key=len)]


def imports(path: Path) -> set[str]:
    """The autoflash modules `path` imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("autoflash")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autoflash"):
            package = node.module
            for alias in node.names:  # `from autoflash import codegen` imports a module, not a name
                child = f"{package}.{alias.name}"
                is_module = (PACKAGE.parent / child.replace(".", "/")).with_suffix(".py").exists() or \
                    (PACKAGE.parent / child.replace(".", "/")).is_dir()
                found.add(child if is_module else package)
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_no_module_imports_from_a_higher_floor():
    upward = sorted((m, i, floor(m), floor(i)) for m, found in graph().items() for i in found
                    if floor(i) > floor(m))
    assert not upward, "imports from a higher floor (module, import, floors): " + repr(upward)


def test_no_import_cycles():
    edges = graph()
    state: dict[str, str] = {}

    def visit(module, path):
        state[module] = "open"
        for other in sorted(edges.get(module, ())):
            if other == module or other not in edges:
                continue
            if state.get(other) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path + [other]))
            if other not in state:
                visit(other, path + [other])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
