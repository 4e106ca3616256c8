"""The type stubs IDEs and type checkers read (dusk/_dusk.pyi, with py.typed) against the
compiled module they describe: the same public names, each class's methods and properties,
and every signature's parameters (names, order, kinds, defaults), so the stubs cannot drift
from python/src. The installed package's files are read (beside dusk/__init__.py): a build
that leaves them out fails too."""

import ast
import inspect
import os

import pytest

import dusk
from dusk import _dusk

PACKAGE = os.path.dirname(dusk.__file__)
STUB = os.path.join(PACKAGE, "_dusk.pyi")
# What every class has from the class machinery rather than from dusk. A constructor
# (PyO3's `#[new]`, a `__new__`) is compared as the class's signature against the stub's
# `__new__`.
NOT_MEMBERS = {"__doc__", "__module__", "__new__", "__init__", "__dict__", "__weakref__"}
P = inspect.Parameter


def runtime_public():
    return {n: getattr(_dusk, n) for n in dir(_dusk) if not n.startswith("_")}


def is_member(name):
    """Public, or a dunder the class defines (`__len__`, `__dlpack__`,
    `__cuda_array_interface__`)."""
    dunder = name.startswith("__") and name.endswith("__")
    return name not in NOT_MEMBERS and (dunder or not name.startswith("_"))


def runtime_members(cls):
    return {n: v for n, v in vars(cls).items() if is_member(n)}


@pytest.fixture(scope="module")
def stub():
    """The stub's top-level definitions by name: classes, functions, annotated constants,
    `__all__` and (private) aliases; imports are not definitions."""
    assert os.path.isfile(STUB), f"no type stub beside {dusk.__file__}: {STUB}"
    with open(STUB) as f:
        tree = ast.parse(f.read(), STUB)
    defs = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            defs[node.name] = node
        elif isinstance(node, ast.AnnAssign):
            defs[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                defs[target.id] = node
    return defs


def stub_members(cls_node):
    return {n.name: n for n in cls_node.body if isinstance(n, ast.FunctionDef)}


def decorated(node, name):
    return any(isinstance(d, ast.Name) and d.id == name for d in node.decorator_list)


def test_package_is_marked_typed():
    assert os.path.isfile(os.path.join(PACKAGE, "py.typed")), f"no py.typed (PEP 561) in {PACKAGE}"


def test_stub_defines_exactly_the_public_names(stub):
    runtime = runtime_public()
    public = {n: node for n, node in stub.items() if not n.startswith("_")}
    assert set(public) == set(runtime), (
        f"only at runtime: {sorted(set(runtime) - set(public))}; "
        f"only in the stub (aliases must be private, `_Name`): {sorted(set(public) - set(runtime))}"
    )
    for name, obj in runtime.items():
        node = public[name]
        if isinstance(obj, type):
            assert isinstance(node, ast.ClassDef), f"{name} is a class at runtime, not in the stub"
        elif callable(obj):
            assert isinstance(node, ast.FunctionDef), f"{name} is a function at runtime, not in the stub"
        else:
            assert isinstance(node, ast.AnnAssign), f"{name} is a constant at runtime: `{name}: type` in the stub"
            assert ast.unparse(node.annotation) == type(obj).__name__, (
                f"{name} is a {type(obj).__name__} at runtime, "
                f"annotated {ast.unparse(node.annotation)} in the stub"
            )
    assert "__all__" in stub, "no __all__ in the stub (the module has one)"
    listed = ast.literal_eval(stub["__all__"].value)
    assert sorted(listed) == sorted(_dusk.__all__), (
        f"__all__: only at runtime: {sorted(set(_dusk.__all__) - set(listed))}; "
        f"only in the stub: {sorted(set(listed) - set(_dusk.__all__))}"
    )


CLASSES = sorted(n for n, v in runtime_public().items() if isinstance(v, type))


@pytest.mark.parametrize("name", CLASSES)
def test_class_members_and_properties(stub, name):
    cls = getattr(_dusk, name)
    try:
        type("Sub", (cls,), {})
    except TypeError:
        final = True
    else:
        final = False
    assert decorated(stub[name], "final") == final, (
        f"{name} {'cannot' if final else 'can'} be subclassed at runtime: "
        f"{'@final' if final else 'no @final'} in the stub"
    )
    runtime = runtime_members(cls)
    members = stub_members(stub[name])
    listed = {n for n in members if is_member(n)}
    assert listed == set(runtime), (
        f"{name}: only at runtime: {sorted(set(runtime) - listed)}; "
        f"only in the stub: {sorted(listed - set(runtime))}"
    )
    for member, value in runtime.items():
        getter = inspect.isdatadescriptor(value)
        assert decorated(members[member], "property") == getter, (
            f"{name}.{member} is a {'getter' if getter else 'method'} at runtime: "
            f"it should be {'a @property' if getter else 'a plain def'} in the stub"
        )


@pytest.mark.parametrize("name", CLASSES)
def test_constructor_in_stub_as_at_runtime(stub, name):
    """PyO3's `#[new]` is a `__new__`: the stub's constructor is one too (as stubtest
    wants), and a class with none (`Array`, made by plans) has none in the stub."""
    try:
        getattr(_dusk, name)()
    except TypeError as e:  # no `device`, or CPython's refusal of a type without tp_new
        made = "cannot create" not in str(e)
    else:
        made = True
    given = {"__init__", "__new__"} & set(stub_members(stub[name]))
    assert given == ({"__new__"} if made else set()), (
        f"{name} {'has a constructor' if made else 'cannot be made from Python'}: "
        f"the stub defines {sorted(given) or 'none'}"
    )


def signed():
    """Every function, method and constructor whose runtime object has a signature, by
    qualified name (`quantize_k`, `PrunePlan.run`, `PrunePlan.__new__`). An abi3 build's
    classes have their constructor's signature from Python 3.10 on (PyO3's limit), so on
    3.9 the constructors are not compared."""
    names = []
    for name, obj in sorted(runtime_public().items()):
        if isinstance(obj, type):
            if obj.__text_signature__ is not None:
                names.append(f"{name}.__new__")
            names += [
                f"{name}.{m}"
                for m, v in sorted(runtime_members(obj).items())
                if getattr(v, "__text_signature__", None) is not None
            ]
        elif getattr(obj, "__text_signature__", None) is not None:
            names.append(name)
    return names


def runtime_params(obj, method):
    """(name, kind, default) of each parameter, the receiver dropped for a method."""
    params = list(inspect.signature(obj).parameters.values())[1 if method else 0 :]
    return [(p.name, p.kind, p.default) for p in params]


def stub_params(fn):
    """(name, kind, default node or None) of each parameter of a stub def."""
    a = fn.args
    positional = [(x, P.POSITIONAL_ONLY) for x in a.posonlyargs] + [(x, P.POSITIONAL_OR_KEYWORD) for x in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [(x.arg, kind, d) for (x, kind), d in zip(positional, defaults)]
    if a.vararg:
        out.append((a.vararg.arg, P.VAR_POSITIONAL, None))
    out += [(x.arg, P.KEYWORD_ONLY, d) for x, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append((a.kwarg.arg, P.VAR_KEYWORD, None))
    return out


def differences(runtime, stub):
    names = ([n for n, _, _ in runtime], [n for n, _, _ in stub])
    if names[0] != names[1]:
        return [f"parameters {names[0]} at runtime, {names[1]} in the stub"]
    found = []
    for (name, kind, default), (_, stub_kind, node) in zip(runtime, stub):
        if kind != stub_kind:
            found.append(f"`{name}` is {kind.description} at runtime, {stub_kind.description} in the stub")
        if default is P.empty:
            if node is not None:
                found.append(f"`{name}` has no default at runtime, {ast.unparse(node)} in the stub")
        elif node is None:
            found.append(f"`{name}` defaults to {default!r} at runtime, has none in the stub")
        elif default is not Ellipsis:  # `...`: the runtime could not render it; any default will do
            try:
                value = ast.literal_eval(node)
            except ValueError:
                found.append(f"`{name}`'s default in the stub, {ast.unparse(node)}, is not a literal")
            else:
                if repr(value) != repr(default):
                    found.append(f"`{name}` defaults to {default!r} at runtime, {ast.unparse(node)} in the stub")
    return found


@pytest.mark.parametrize("qualname", signed())
def test_signature(stub, qualname):
    owner, _, member = qualname.rpartition(".")
    if not owner:
        obj, method, fn = getattr(_dusk, member), False, stub.get(member)
    else:
        cls = getattr(_dusk, owner)
        # A constructor's signature is the class's (`(device)`), the stub's `__new__` less cls.
        obj, method = (cls, False) if member == "__new__" else (vars(cls)[member], True)
        fn = stub_members(stub[owner]).get(member)
    assert isinstance(fn, ast.FunctionDef), f"{qualname} is missing from the stub"
    params = stub_params(fn)[1:] if owner else stub_params(fn)
    found = differences(runtime_params(obj, method), params)
    assert not found, f"{qualname}{inspect.signature(obj)}: " + "; ".join(found)
