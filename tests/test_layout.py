"""The package's layout rules: the plugin's core (what --user-dir loads) imports nothing of the
tools around it, imports go one way (no cycle, function-level and annotation-only imports included), every file stays
small, no hook carries data between modules, and the checkout's top-level folders hold no logic."""

import ast
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fairseq_sparse"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.AST) -> List[ast.AST]:
    """Every import statement, at any depth, those under ``if TYPE_CHECKING:`` included: a cycle of
    annotations is a cycle of what a reader must hold in mind at once."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def import_graph() -> Dict[str, Set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: Dict[str, Set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                while target and target not in paths:
                    target = target.rsplit(".", 1)[0] if "." in target else ""
                # a module importing its own package (e.g. for its registrations) is not an edge back
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package():
    assert cycles(import_graph()) == []


def test_every_file_of_the_package_stays_small():
    """A smell detector, not a rule to cut a concept by: a file past 400 lines probably holds two."""
    sizes = {str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
             for path in PACKAGE.rglob("*.py")}
    assert {name: lines for name, lines in sizes.items() if lines > 400} == {}


def test_the_core_imports_nothing_of_the_tools_around_it():
    """fairseq_sparse.core is the plugin fairseq loads; data, experiments, bench, analysis and the
    commands build on it, never the other way round. The package's __init__ (what --user-dir runs)
    imports the core only."""
    graph = import_graph()
    core = {name for name in graph if name == "fairseq_sparse.core" or name.startswith("fairseq_sparse.core.")}
    assert core, "no fairseq_sparse.core"
    outward = {name: sorted(target for target in graph[name] if target not in core) for name in core}
    assert {name: targets for name, targets in outward.items() if targets} == {}
    assert graph["fairseq_sparse"] <= core, sorted(graph["fairseq_sparse"] - core)


def test_no_hook_carries_data_between_modules():
    """The core passes data as arguments and return values; forward hooks belong to the analysis
    tools, which observe a model from outside."""
    for path in (PACKAGE / "core").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "register_forward_hook" not in text and "register_forward_pre_hook" not in text, path


def test_checkout_entry_points_hold_no_logic():
    """data-prep/NAME.py only runs fairseq_sparse.data.NAME; configs/ is the package's own folder."""
    for script in (ROOT / "data-prep").glob("*.py"):
        text = script.read_text(encoding="utf-8")
        assert f'runpy.run_module("fairseq_sparse.data.{script.stem}"' in text and len(text.splitlines()) <= 6, script
    assert (ROOT / "configs").resolve() == PACKAGE / "configs"


def test_test_folders_mirror_the_package():
    tests = ROOT / "tests"
    folders = [d for d in tests.rglob("*") if d.is_dir() and not {"fixtures", "__pycache__"} & set(d.relative_to(tests).parts)]
    assert folders and all((PACKAGE / d.relative_to(tests)).is_dir() for d in folders), folders
    # pytest's default import mode puts each test folder on sys.path: test file names must differ
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names))


def test_data_and_bench_reach_nothing_of_the_table_runner():
    """The table runner builds on data preparation and the benchmarks, never the other way round: no import
    path, direct or through other modules, leads from data/ or bench/ to experiments/."""
    graph = import_graph()
    below = [name for name in graph if name.startswith(("fairseq_sparse.data", "fairseq_sparse.bench"))]
    assert below
    reached = {}
    for start in below:
        seen, todo = set(), [start]
        while todo:
            for target in graph[todo.pop()] - seen:
                seen.add(target)
                todo.append(target)
        runner = sorted(name for name in seen if name.startswith("fairseq_sparse.experiments"))
        if runner:
            reached[start] = runner
    assert reached == {}
