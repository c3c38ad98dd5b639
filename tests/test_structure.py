"""The shape of the code base (docs/design.md, "Layers"): packages import only downwards, without
cycles, and TVM's private names are used in one module only. Read from the source, nothing imported."""

import ast
import io
import itertools
import os
import tokenize

import pytest

from tests.helpers import ROOT

PACKAGES = ("support", "passes", "schedules", "frontend", "runtime", "compiler", "benchmarks", "tools", "tests")
FOLDERS = {"frontend": os.path.join("compiler", "frontend"),  # a layer's folder, where not its name
           "runtime": os.path.join("compiler", "runtime")}
# what each package may import of relaxc's own
ALLOWED = {
    "support": set(),
    "passes": {"support"},
    "schedules": {"support", "passes"},
    "frontend": {"support"},  # the ONNX front end: ONNX in, a Relax module out
    "runtime": {"support"},  # what a deployment imports: an artifact loaded, run, generating, serving
    "compiler": {"support", "passes", "schedules", "frontend", "runtime"},
    "benchmarks": {"support", "passes", "schedules", "frontend", "runtime", "compiler"},
    "tools": {"support", "passes", "schedules", "frontend", "runtime", "compiler", "benchmarks"},  # not installed
    "tests": set(PACKAGES),
}
PRIVATE_OK = os.path.join("support", "tvm_internals.py")
INSTALLED = ("support", "passes", "schedules", "frontend", "runtime", "compiler", "benchmarks")  # the package relaxc
MAX_LOGIC_LINES = 400  # a module longer than this holds several concepts: split it along them


def _sources(package: str):
    """The package's modules, those of a layer inside its folder (compiler/frontend) left out."""
    inner = {os.path.join(ROOT, f) for p, f in FOLDERS.items() if p != package}
    for folder, subfolders, files in os.walk(os.path.join(ROOT, FOLDERS.get(package, package))):
        subfolders[:] = [d for d in subfolders if os.path.join(folder, d) not in inner]
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, ROOT), ast.parse(open(path).read(), path)


def _imported_modules(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):  # imports inside functions count too
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


def _layer(module: str) -> str | None:
    """The folder a module of relaxc's own lives in: ``relaxc.passes.x`` is passes, ``relaxc.x`` compiler,
    ``tools.experiments.x`` tools; None for anything else (a bare ``passes`` or ``compiler`` is not
    relaxc's: the package is ``relaxc``)."""
    parts = module.split(".")
    if parts[0] in ("tests", "tools"):
        return parts[0]
    if parts[0] != "relaxc":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES and parts[1] != "tests" else "compiler"


def _package_imports() -> dict[str, set[str]]:
    edges = {package: set() for package in PACKAGES}
    for package in PACKAGES:
        for _, tree in _sources(package):
            edges[package] |= {_layer(m) for m in _imported_modules(tree)} - {None, package}
    return edges


def test_relaxc_is_imported_by_its_one_name():
    """The folders install under ``relaxc``: importing ``compiler`` or ``passes`` by their folder names
    works only in a checkout, and would load a second copy of each module beside ``relaxc``'s."""
    old = {"compiler", "passes", "schedules", "support", "benchmarks"}
    offenders = {path: sorted(m for m in _imported_modules(tree) if m.split(".")[0] in old)
                 for package in PACKAGES for path, tree in _sources(package)}
    assert {path: found for path, found in offenders.items() if found} == {}


def test_packages_import_only_the_layers_below():
    edges = _package_imports()
    for package, imported in edges.items():
        assert imported <= ALLOWED[package], f"{package} imports {sorted(imported - ALLOWED[package])}"


def test_no_import_cycle_between_packages():
    edges = _package_imports()
    for a, b in itertools.permutations(PACKAGES, 2):
        assert not (b in edges[a] and a in edges[b]), f"{a} and {b} import each other"


def test_layer_rules_catch_an_upward_import():
    """The check above can fail: a passes module importing compiler is reported, and so are a
    runtime module importing the compile side and a benchmarks module importing tools."""
    tree = ast.parse("def f():\n    from relaxc.build.pipeline import PHASES\n")
    assert {_layer(m) for m in _imported_modules(tree)} - ALLOWED["passes"] == {"compiler"}
    tree = ast.parse("from relaxc.build import profile\nimport relaxc.passes.ir\n")  # the runtime side: no compile side
    assert {_layer(m) for m in _imported_modules(tree)} - ALLOWED["runtime"] == {"compiler", "passes"}
    tree = ast.parse("from tools.experiments import ab\n")  # tools is not installed: relaxc cannot import it
    assert {_layer(m) for m in _imported_modules(tree)} - ALLOWED["benchmarks"] == {"tools"}


def _private_tvm_uses(tree: ast.AST) -> list[str]:
    """``from tvm... import _x``, ``tvm.x._y`` imports, and ``name._x`` attribute chains whose root is
    a name bound by an import from tvm or tvm_ffi."""
    private = lambda part: part.startswith("_") and not part.startswith("__")  # noqa: E731
    tvm_names, uses = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("tvm", "tvm_ffi"):
                    tvm_names.add((alias.asname or alias.name).split(".")[0])
                    uses += [alias.name for part in alias.name.split(".") if private(part)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("tvm", "tvm_ffi"):
            uses += [node.module for part in node.module.split(".") if private(part)]
            for alias in node.names:
                tvm_names.add(alias.asname or alias.name)
                if private(alias.name):
                    uses.append(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in tvm_names:
                uses.append(f"{root.id}...{node.attr}")
    return uses


def test_private_tvm_names_only_in_tvm_internals():
    offenders = {path: uses for package in PACKAGES for path, tree in _sources(package)
                 if path != PRIVATE_OK and (uses := _private_tvm_uses(tree))}
    assert offenders == {}


@pytest.mark.parametrize("code, found", [
    ("from tvm.relax import vm_build\nvm_build._vmcodegen(1, 2, 3)", True),
    ("from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map", True),
    ("import tvm\ntvm.s_tir.meta_schedule.tune_context._normalize_mod(f)", True),
    ("import tvm\nx = tvm.IRModule()\nx.__class__", False),
    ("class A:\n    def f(self):\n        return self._private", False),
])
def test_private_name_check_sees_each_form(code, found):
    assert bool(_private_tvm_uses(ast.parse(code))) == found
    if found:  # and the fence does hold the real ones
        assert _private_tvm_uses(ast.parse(open(os.path.join(ROOT, PRIVATE_OK)).read()))


def logic_lines(source: str) -> int:
    """Lines holding code or docstrings: blank lines and comment-only lines aside."""
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines |= set(range(token.start[0], token.end[0] + 1))
    return len(lines)


def test_no_module_of_the_package_is_over_the_limit():
    sizes = {path: logic_lines(open(os.path.join(ROOT, path)).read())
             for package in INSTALLED for path, _ in _sources(package)}
    assert {path: n for path, n in sizes.items() if n > MAX_LOGIC_LINES} == {}


def test_logic_lines_leave_out_blank_and_comment_lines():
    source = '"""Doc\nstring."""\n\n# a comment\nx = (1,\n     2)  # trailing\n'
    assert logic_lines(source) == 4
