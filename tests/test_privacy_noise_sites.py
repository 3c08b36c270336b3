"""No DP noise is drawn outside dpsyn/privacy: every method calls gaussian_mechanism / laplace_mechanism.

A static scan of the dpsyn package (dpsyn/privacy excluded). It follows DP generators, not variable names:

* sources: the result of ``dp_generator(...)`` / ``dp_numpy_generator(...)`` (assigned to a name or attribute, or
  passed straight into a call), a function that returns one, and Opacus's ``optimizer.generator`` (the DP-SGD noise
  generator);
* propagation: a tainted argument taints the matching parameter of every function of that name in the package
  (by keyword, or by position), until nothing changes;
* sinks: ``g.normal(`` / ``g.laplace(`` / ``g.standard_normal(`` ... on a tainted numpy generator, and
  ``torch.normal`` / ``torch.randn`` / ``randn_like`` / ``.normal_(`` ... with ``generator=`` a tainted one.

Latent draws (``torch.randn(b, z_dim, generator=gen)`` with the run-seed generator, ``rng.standard_normal`` of a
seeded sampler) are not DP noise and are not flagged, because their generator never comes from a DP source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dpsyn

SOURCES = {"dp_generator", "dp_numpy_generator"}
NUMPY_DRAWS = {"normal", "laplace", "standard_normal", "standard_laplace", "gumbel", "exponential",
               "standard_exponential", "logistic"}
TORCH_DRAWS = {"normal", "randn", "randn_like", "normal_", "exponential_", "cauchy_", "log_normal_"}
DP_ATTRS = {"optimizer.generator"}  # Opacus's DPOptimizer draws its noise from this generator


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _walk(scope: ast.AST):
    """The nodes of ``scope``: a function with its nested closures, a module without its functions' bodies."""
    if not isinstance(scope, ast.Module):
        yield from ast.walk(scope)
        return
    todo = [scope]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _plain_or_self(call: ast.Call) -> bool:
    """``f(...)`` or ``self.f(...)``: the calls matched to a function by name (``x.numpy()`` is not a DP source)."""
    f = call.func
    return isinstance(f, ast.Name) or (isinstance(f, ast.Attribute) and _dotted(f.value) in ("self", "cls"))


class _Scan:
    def __init__(self, files: dict[str, str]) -> None:
        self.trees = {name: ast.parse(src) for name, src in files.items()}
        self.funcs: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for tree in self.trees.values():
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.funcs.setdefault(node.name, []).append(node)
        self.sources = set(SOURCES)  # grows by functions that return a DP generator
        self.tainted: dict[int, set[str]] = {}  # id(scope) -> tainted dotted names (parameters included)

    def _is_dp(self, node: ast.AST | None, names: set[str]) -> bool:
        """Whether ``node`` evaluates to a DP generator (not: a value computed from one)."""
        if isinstance(node, (ast.Name, ast.Attribute)):
            d = _dotted(node)
            return d is not None and (d in names or any(d == a or d.endswith("." + a) for a in DP_ATTRS))
        if isinstance(node, ast.Call):
            return _callee(node) in self.sources and _plain_or_self(node)
        if isinstance(node, ast.IfExp):
            return self._is_dp(node.body, names) or self._is_dp(node.orelse, names)
        if isinstance(node, ast.BoolOp):
            return any(self._is_dp(v, names) for v in node.values)
        return False

    def _scopes(self):
        for tree in self.trees.values():
            yield tree
            yield from (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))

    def _propagate(self) -> bool:
        changed = False
        for scope in self._scopes():
            names = self.tainted.setdefault(id(scope), set())
            for node in _walk(scope):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        pairs = (list(zip(t.elts, node.value.elts))
                                 if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple)
                                 and len(t.elts) == len(node.value.elts) else
                                 [(e, node.value) for e in (t.elts if isinstance(t, ast.Tuple) else [t])])
                        for target, value in pairs:
                            d = _dotted(target)
                            if d is not None and d not in names and self._is_dp(value, names):
                                names.add(d)
                                changed = True
                elif isinstance(node, ast.Return) and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if scope.name not in self.sources and self._is_dp(node.value, names):
                        self.sources.add(scope.name)
                        changed = True
                elif isinstance(node, ast.Call):
                    name = _callee(node)
                    hits = [(i, None) for i, a in enumerate(node.args) if self._is_dp(a, names)]
                    hits += [(None, k.arg) for k in node.keywords if k.arg and self._is_dp(k.value, names)]
                    for fn in self.funcs.get(name, []) if hits else []:
                        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
                        if params[:1] in (["self"], ["cls"]) and isinstance(node.func, ast.Attribute):
                            params = params[1:]
                        kw = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
                        inner = self.tainted.setdefault(id(fn), set())
                        for pos, key in hits:
                            p = params[pos] if pos is not None and pos < len(params) else key if key in kw else None
                            if p is not None and p not in inner:
                                inner.add(p)
                                changed = True
        return changed

    def violations(self) -> list[str]:
        while self._propagate():
            pass
        found = []
        for fname, tree in self.trees.items():
            scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for scope in scopes:
                names = self.tainted.get(id(scope), set())
                for node in _walk(scope):
                    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                        continue
                    attr, recv = node.func.attr, node.func.value
                    gen = next((k.value for k in node.keywords if k.arg == "generator"), None)
                    if attr in NUMPY_DRAWS and _dotted(recv) != "torch" and self._is_dp(recv, names):
                        found.append(f"{fname}:{node.lineno}: {ast.unparse(node)}")
                    elif attr in TORCH_DRAWS and self._is_dp(gen, names):
                        found.append(f"{fname}:{node.lineno}: {ast.unparse(node)}")
        return sorted(set(found))


def _package_files() -> dict[str, str]:
    root = Path(dpsyn.__file__).parent
    return {str(p.relative_to(root.parent)): p.read_text() for p in sorted(root.rglob("*.py"))
            if "privacy" not in p.relative_to(root).parts[:1]}


def test_no_dp_noise_is_drawn_outside_dpsyn_privacy():
    files = _package_files()
    assert any(f.endswith("methods/dp_mge.py") for f in files) and not any("/privacy/" in f for f in files)
    assert _Scan(files).violations() == []


# The scan itself: it must catch each form the methods used before (83123e5) and leave latent draws alone.
_BAD = '''
import torch
from dpsyn.privacy import dp_generator, dp_numpy_generator

def moments(sums, sigma, rng):
    return sums + rng.normal(0.0, sigma, size=sums.shape)

def sanitize(grad, sigma, *, generator):
    return grad + sigma * torch.randn(grad.shape, generator=generator)

def noise_only_step(optimizer, p):
    return torch.normal(0.0, 1.0, size=p.shape, generator=optimizer.generator)

class M:
    def _gen(self):
        return dp_numpy_generator(deterministic=False)

    def fit(self, sums, counts):
        rng = dp_numpy_generator(deterministic=False)
        moments(sums, 1.0, rng)
        sanitize(sums, 1.0, generator=dp_generator())
        noise_rng = self._gen() if counts.sum() > 0 else None
        return counts + noise_rng.standard_normal(3), counts + noise_rng.laplace(0.0, 1.0, 3)
'''

_GOOD = '''
import numpy as np
import torch
from dpsyn.privacy import dp_numpy_generator, gaussian_mechanism

def moments(sums, sigma, rng):
    return gaussian_mechanism(sums, sigma, generator=rng)

def latent(b, z_dim, seed):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    return torch.randn(b, z_dim, generator=gen), rng.standard_normal(3), rng.normal(0.0, 1.0, 3)

def fit(sums, seed):
    rng = dp_numpy_generator(deterministic=False)
    return moments(sums, 1.0, rng), latent(2, 3, seed)
'''


def test_the_scan_flags_every_hand_drawn_form_and_no_latent_draw():
    bad = _Scan({"bad.py": _BAD}).violations()
    assert sorted(v.split(": ", 1)[1].split("(")[0] for v in bad) == [
        "noise_rng.laplace", "noise_rng.standard_normal", "rng.normal", "torch.normal", "torch.randn"]
    assert _Scan({"good.py": _GOOD}).violations() == []
