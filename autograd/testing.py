"""Property-based gradient tests for autograd ops, your own included. Needs hypothesis and pytest.

    from autograd import testing

    def test_swish_gradient():
        testing.check_gradients(swish, testing.arrays(testing.shapes()))

The strategies draw shapes and float64 values that keep finite differences honest: away from
zero denominators, from an op's kinks, from ties. `check_gradients` draws inputs, compares the
backward pass with central finite differences and, when they disagree, lets hypothesis shrink
the inputs to a small example whose error names the input and the entries. `check_fast_paths` compares
an op's fast paths with its reference on any device (the CPU, the emulated CUDA device, a GPU), in float32
and bfloat16, as `assert_fast_path_matches` does for inputs a test gives. `checks_gradient_of` and
`assert_every_function_tested` fail a suite where an op has no gradient test (`checks_fast_path_of`: or
a fast path no test compares with its reference); `DEVICES`, `each_path`: pytest.
"""

import contextlib
import importlib
import inspect
import math
import pkgutil
import types

import numpy as np

try:
    import hypothesis
    import pytest
    from hypothesis import given, note
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as error:  # the engine itself never needs them
    raise ImportError(
        "autograd.testing needs hypothesis and pytest: pip install hypothesis pytest (or tinygpt's test "
        "extra: pip install 'tinygpt[test]')"
    ) from error

from . import backend, kernels
from .gradcheck import GradcheckError, gradcheck, jacobian_check
from .kernels import use_reference
from .tensor import Function, Tensor, no_grad, tensor

# ----- strategies ------------------------------------------------------------------------------


def shapes(min_dims=0, max_dims=3, min_side=1, max_side=4):
    """Array shapes of min_dims to max_dims axes, each of min_side to max_side entries."""
    drawn = hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)
    return _valid(drawn)


def broadcastable_shapes(count=2, min_dims=0, max_dims=3, min_side=1, max_side=3):
    """Tuples of `count` shapes that broadcast together, size-1 and missing axes included."""
    drawn = hnp.mutually_broadcastable_shapes(
        num_shapes=count, min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side
    )
    return _valid(drawn).map(lambda drawn: drawn.input_shapes)


def arrays(shape, low=-3.0, high=3.0, dtype=np.float64):
    """Arrays of `shape` (a shape or a strategy for one) with finite values in [low, high]."""
    elements = st.floats(low, high, allow_nan=False, allow_infinity=False, width=np.dtype(dtype).itemsize * 8)
    return _valid(hnp.arrays(dtype, _shape("arrays", shape), elements=elements))


def broadcastable_arrays(count=2, elements=arrays, **shape_options):
    """Tuples of `count` arrays whose shapes broadcast together; `elements(shape)` draws each."""
    if not callable(elements):
        raise TypeError(f"broadcastable_arrays: elements must be a function of a shape, not {elements!r}")
    return broadcastable_shapes(count, **shape_options).flatmap(
        lambda drawn: st.tuples(*(elements(shape) for shape in drawn))
    )


def away_from(points, shape, margin=0.1, low=-3.0, high=3.0):
    """Float64 arrays with values in [low, high], each at least `margin` from every one of
    `points`: inputs away from an op's kinks (relu and abs at 0, clip at its bounds), where a
    finite difference would straddle two slopes."""
    if not margin >= 0:
        raise ValueError(f"away_from: margin must be >= 0, got {margin!r}")
    points = sorted(points)
    gaps_fit = all(b - a >= 2 * margin for a, b in zip(points, points[1:]))
    if not gaps_fit or (points and (points[0] - margin < low or points[-1] + margin > high)):
        raise ValueError(f"away_from: the points {points} +- {margin} must lie apart, inside [{low}, {high}]")

    def step_over_gaps(value):  # draw on the line with the gaps cut out, then put them back
        for point in points:
            value += 2 * margin if value >= point - margin else 0.0
        return min(value, high)  # the sums may round one ulp past it

    elements = st.floats(low, high - 2 * margin * len(points)).map(step_over_gaps)
    return _valid(hnp.arrays(np.float64, _shape("away_from", shape), elements=elements))


def away_from_zero(shape, low=0.5, high=3.0):
    """Float64 arrays whose entries have magnitude in [low, high], either sign: safe denominators."""
    return away_from([0.0], shape, margin=low, low=-high, high=high)


def distinct(shape, gap=1e-3, low=-3.0, high=3.0):
    """Float64 arrays in [low, high] whose entries differ pairwise by at least `gap`: no ties for
    max or sort, whose gradient would pick one of two equal entries. A shape with more entries than
    [low, high] holds values `gap` apart is refused (when drawn, for a strategy of shapes)."""
    if not (isinstance(gap, (int, float)) and 0 < gap < math.inf):
        raise ValueError(f"distinct: gap must be a finite number > 0, got {gap!r}")
    first, last = math.ceil(low / gap), math.floor(high / gap)

    def fitting(shape):
        entries = math.prod(_shape("distinct", shape))
        if entries > last - first + 1:
            raise ValueError(
                f"distinct: a shape of {entries} entries, but only {max(last - first + 1, 0)} values "
                f"{gap} apart lie in [{low}, {high}]"
            )
        return shape

    shape = _shape("distinct", shape)
    shape = shape.map(fitting) if isinstance(shape, st.SearchStrategy) else fitting(shape)
    steps = st.integers(first, last).map(lambda k: k * gap)
    return _valid(hnp.arrays(np.float64, shape, elements=steps, unique=True))


def indices(size, shape, negative=False):
    """Int64 arrays of `shape` with entries in [0, size), or in [-size, size) with `negative`:
    token ids for an embedding, positions to gather."""
    if not (isinstance(size, (int, np.integer)) and size >= 1):
        raise ValueError(f"indices: size must be an integer >= 1, got {size!r}")
    elements = st.integers(-size if negative else 0, size - 1)
    return _valid(hnp.arrays(np.int64, _shape("indices", shape), elements=elements))


def leaf(array, device="cpu", requires_grad=True):
    """A float64 leaf tensor on `device` holding `array`."""
    return tensor(array, requires_grad=requires_grad, dtype=np.float64, device=device)


def tensors(values, device="cpu", requires_grad=True):
    """Float64 leaf tensors on `device` holding the arrays that the strategy `values` draws."""
    return _strategy("tensors", "values", values).map(lambda array: leaf(array, device, requires_grad))


# ----- the gradient property -------------------------------------------------------------------


def assert_gradients(fn, *inputs, names=None, eps=1e-6, atol=1e-6, rtol=1e-5, max_jacobian=4096):
    """Check the backward of fn(*inputs) against finite differences along a random direction
    (`gradcheck`). When the two disagree and the Jacobian has at most `max_jacobian` entries,
    compare it whole (`jacobian_check`), so that the error names the entries."""
    try:
        gradcheck(fn, inputs, eps=eps, atol=atol, rtol=rtol, names=names)
    except GradcheckError:
        with no_grad():
            outputs = fn(*inputs).data.size
        entries = sum(x.size for x in inputs if isinstance(x, Tensor) and x.requires_grad)
        if outputs * entries <= max_jacobian:
            jacobian_check(fn, inputs, eps=eps, atol=atol, rtol=rtol, names=names)
        raise


def check_gradients(fn, *strategies, device="cpu", settings=None, requires_grad=None, **tolerances):
    """A hypothesis property: for inputs drawn from `strategies`, one per argument of fn (a
    strategy that draws a tuple gives several), the backward of fn agrees with central finite
    differences in float64. Drawn float arrays become float64 tensors on `device`; which of them
    require grad is drawn too (at least one), so that an op's path for an input that needs no
    gradient runs as well, or fixed by `requires_grad`, a tuple of booleans, one per drawn array.
    Tensors and anything else (ids, axes) pass as drawn. On failure hypothesis shrinks the inputs
    and raises a GradcheckError that names the input and entries that disagree; its notes give the
    drawn inputs by fn's parameter names and which required grad. `settings`: hypothesis settings
    for this property (as `settings(max_examples=500)`), else the profile's with no deadline.
    `tolerances`: eps, atol, rtol and max_jacobian of `assert_gradients`.

    float64 on a GPU runs the reference paths, so on a GPU device the fast paths are checked too,
    as check_fast_paths does in float32. Returns what it ran, a line for each property."""
    if unknown := set(tolerances) - {"eps", "atol", "rtol", "max_jacobian"}:
        raise TypeError(
            f"check_gradients: no argument {', '.join(sorted(unknown))} (its tolerances: eps, atol, rtol, "
            "max_jacobian)"
        )

    def gradients_agree(values, wanted, names, data):
        inputs = _inputs(values, wanted, device)
        named = len(_parameter_names(fn)) >= len(inputs)  # else gradcheck numbers them
        assert_gradients(fn, *inputs, names=names if named else None, **tolerances)

    examples, paths = _property("check_gradients", fn, strategies, requires_grad, settings, gradients_agree)
    report = [f"float64 on {device}: gradients match finite differences in {examples} examples ({paths})"]
    if backend.parse_device(device) != "cpu":
        report.append(_fast_paths(fn, strategies, device, (np.float32,), settings, requires_grad, {})[0])
    return "\n".join(report)


TOLERANCES = {"float32": (1e-4, 1e-5), "bfloat16": (2**-5, 2**-5), "float64": (1e-10, 1e-12)}  # rtol, atol


def check_fast_paths(
    fn, *strategies, device="cpu", dtypes=(np.float32,), settings=None, requires_grad=None, tolerances=None
):
    """A hypothesis property: fn on its ops' fast paths gives the numbers of their reference paths
    (autograd.use_reference), its output and the gradients of the inputs that require grad, for
    inputs drawn as check_gradients draws them, made tensors of each of `dtypes` on `device`, and a
    drawn output gradient. Within TOLERANCES for each dtype, or `tolerances` ({dtype name: (rtol,
    atol)}). Fails when no fast path ran at all: fn's ops have none for the device and dtypes, or
    their fits_<device> refused every example. Returns what it ran."""
    line, ran = _fast_paths(fn, strategies, device, dtypes, settings, requires_grad, tolerances or {})
    if not ran:
        raise AssertionError(f"check_fast_paths: {line}")
    return line


def _fast_paths(fn, strategies, device, dtypes, settings, requires_grad, tolerances):
    """(what the fast path property ran, a line; whether any fast path ran)."""
    dtypes = [np.dtype(dtype) for dtype in (dtypes if isinstance(dtypes, (tuple, list)) else [dtypes])]
    _limits("check_fast_paths", tolerances)  # checked before the first example

    def fast_matches_reference(values, wanted, names, data):
        seed = data.draw(st.integers(0, 2**32 - 1), label="output gradient seed")
        for dtype in dtypes:
            options = dict(device=device, dtype=dtype, seed=seed, requires_grad=wanted)
            assert_fast_path_matches(fn, *values, tolerances=tolerances, **options)

    examples, paths = _property(
        "check_fast_paths", fn, strategies, requires_grad, settings, fast_matches_reference
    )
    kinds = " and ".join(map(str, dtypes))
    if paths.startswith("no"):
        return f"{kinds} on {device}: {paths}, so nothing was compared in {examples} examples", False
    matched = f"fast paths match the reference, forward and backward, in {examples} examples"
    return f"{kinds} on {device}: {matched} ({paths})", True


def assert_fast_path_matches(
    fn,
    *values,
    device,
    dtype,
    seed=0,
    tolerances=None,
    requires_grad=None,
    scale=None,
    reference=None,
    slack=(),
):
    """check_fast_paths's comparison, for inputs a test gives (float arrays become tensors on `device` of
    `dtype`, or of dtype[i] for the i-th, that require grad or as `requires_grad` says): of one type and
    close, the output within the tolerance of the least precise of its type and the inputs', a gradient
    within its input's, for an output gradient drawn from `seed`. `scale`, `slack`, `reference`: see
    docs/your-own-op.md."""
    caller, floats = "assert_fast_path_matches", sum(map(_floating, values))
    dtypes = [np.dtype(t) for t in (dtype if isinstance(dtype, (tuple, list)) else [dtype] * floats)]
    wanted, limits = list(requires_grad or [True] * floats), _limits(caller, tolerances or {})
    if len(dtypes) != floats or len(wanted) != floats:
        raise ValueError(f"{caller}: {len(dtypes)} dtypes, {len(wanted)} requires_grad for {floats} arrays")
    if not isinstance(slack, (tuple, list)) or len(slack) > 1 + sum(wanted):
        raise TypeError(f"{caller}: slack is a list, the output's then each gradient's, not {slack!r}")
    fast = _forward_backward(fn, values, wanted, device, dtypes, seed, False)
    with reference or contextlib.nullcontext():
        slow = _forward_backward(fn, values, wanted, device, dtypes, seed, True)
    least_precise = min([*dtypes, fast[0][1].dtype], key=lambda t: t.itemsize)  # for the output
    kinds = [least_precise] + [t for t, w in zip(dtypes, wanted) if w]
    for (what, a), (_, b), kind, forgiven in zip(fast, slow, kinds, [*slack, *[0.0] * len(fast)]):
        differ = "differ" + " (less the slack)" * bool(np.any(forgiven))
        what = f"{what} ({kind} on {device}): fast path and reference {differ}"
        assert a.dtype == b.dtype, f"{what} in type: {a.dtype} against {b.dtype}"
        a, b = a.astype(np.float64), b.astype(np.float64)
        rtol, atol = limits.get(str(kind), limits["float32"])  # float32's for a type TOLERANCES lacks
        if scale is not None:  # finite ones: a NaN or an infinity passes only where both have it
            atol *= max(1.0, scale, np.abs(b[np.isfinite(b)]).max(initial=0))
        with np.errstate(invalid="ignore"):  # inf - inf: NaN, left to assert_allclose
            gap = a - b  # of which `forgiven` is taken off before the tolerance
        a = np.where(np.isfinite(gap), b + np.sign(gap) * np.maximum(np.abs(gap) - forgiven, 0), a)
        np.testing.assert_allclose(a, b, rtol, atol, err_msg=what)


def _limits(caller, tolerances):
    """{dtype name: (rtol, atol)}: TOLERANCES, and those `tolerances` gives."""
    try:
        given = {str(np.dtype(k)): v for k, v in tolerances.items()}
    except (AttributeError, TypeError):  # not a dict, or a key that names no dtype
        given = None
    if given is None or not all(isinstance(v, tuple) and len(v) == 2 for v in given.values()):
        raise TypeError(f"{caller}: tolerances are {{dtype: (rtol, atol)}} for dtypes, not {tolerances!r}")
    return TOLERANCES | given


def _forward_backward(fn, values, wanted, device, dtypes, seed, reference):
    """[("output", fn's output), ("gradient of <name>", its gradient) ...] as host arrays, for
    inputs of `dtypes` on `device` and an output gradient drawn from `seed`, on the reference paths or not."""
    with use_reference(reference):
        inputs = _inputs(values, wanted, device, dtypes)
        out = fn(*inputs)
        if not isinstance(out, Tensor):  # as gradcheck says for check_gradients
            raise TypeError(
                f"check_fast_paths: fn gave a {type(out).__name__}, not a Tensor (add several outputs up)"
            )
        out.backward(np.random.default_rng(seed).standard_normal(out.shape))
    # a tensor given is fn's own, its gradient added up over both runs: not compared
    named = zip(_names(fn, values), values, inputs)
    grads = [(f"gradient of {n}", x.grad) for n, v, x in named if _floating(v) and x.requires_grad]
    return [(what, backend.to_host(a)) for what, a in [("output", out.data), *grads]]


def _inputs(values, wanted, device, dtypes=None):
    """The drawn values as fn takes them: float arrays as tensors on `device`, float64 or of `dtypes` (one
    for each), that require grad as `wanted` says; anything else as drawn."""
    flags, types = iter(wanted), iter(dtypes or [np.float64] * len(values))
    return [
        tensor(v, dtype=next(types), device=device, requires_grad=next(flags)) if _floating(v) else v
        for v in values
    ]


def _property(caller, fn, strategies, requires_grad, settings, body):
    """Run `body(values, wanted, names, data)` as a hypothesis property over the values `strategies`
    draw (spread where a strategy draws a tuple), `wanted` (which float arrays require grad: drawn
    or `requires_grad`), their names and hypothesis's data. Returns (how many examples ran, which
    fast paths ran in them, in words). `caller` names the property in its errors and its test."""
    if not callable(fn):
        raise TypeError(f"{caller}: fn must be callable, not {fn!r}")
    for i, strategy in enumerate(strategies):
        _strategy(caller, f"strategy {i}", strategy)
    parameters = _parameter_names(fn)
    keys = parameters if len(parameters) == len(strategies) else [f"input{i}" for i in range(len(strategies))]
    examples, before = [], kernels.fast_path_calls.copy()

    def prop(_draws, **drawn):
        values = [value for key in keys for value in _spread(drawn[key])]
        wanted = _draws.draw(_require_grad(values, requires_grad), label="requires_grad")
        names, flags = _names(fn, values), iter(wanted)
        for name, value in zip(names, values):
            need = f" (requires grad: {next(flags)})" if _floating(value) else ""
            note(f"{name} = {value!r}{need}")
        examples.append(body(values, wanted, names, _draws))

    title = getattr(fn, "__name__", "")
    prop.__name__ = f"{caller.removeprefix('check_')}_of_{title if title.isidentifier() else 'fn'}"
    test = given(_draws=st.data(), **dict(zip(keys, strategies)))(prop)
    (settings or hypothesis.settings(deadline=None))(test)()  # a first example may compile a kernel
    ran = kernels.fast_path_calls - before
    paths = ", ".join(f"{name} {calls}" for name, calls in sorted(ran.items()))
    return len(examples), f"calls on a fast path: {paths}" if ran else "no fast path ran"


def _names(fn, values):
    """fn's parameter names for the drawn values, where it names as many; else "input 0", "input 1", ..."""
    names = _parameter_names(fn)[: len(values)]
    return names if len(names) == len(values) else [f"input {i}" for i in range(len(values))]


def _valid(strategy):
    """`strategy`, its arguments checked now (hypothesis's InvalidArgument, a TypeError, names the
    one out of range) rather than when a test first draws from it."""
    strategy.validate()
    return strategy


def _strategy(caller, name, value):
    if not isinstance(value, st.SearchStrategy):
        kind = type(value).__name__
        raise TypeError(f"{caller}: {name} must be a hypothesis strategy, not a {kind} (st.just(x) draws x)")
    return value


def _shape(caller, shape):
    """A shape (an integer, or a tuple or list of them) as a tuple, or a strategy for one; a
    TypeError for anything else."""
    if isinstance(shape, st.SearchStrategy):
        return shape
    sides = shape if isinstance(shape, (tuple, list)) else (shape,)
    if all(isinstance(n, (int, np.integer)) and n >= 0 for n in sides):
        return tuple(int(n) for n in sides)
    raise TypeError(f"{caller}: shape must be a tuple of integers >= 0 or a strategy for one, not {shape!r}")


def _parameter_names(fn):
    """The names of fn's positional parameters (none when it takes *args or has no signature)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins and callables without a signature
        return []
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _spread(value):
    return value if isinstance(value, tuple) else (value,)


def _floating(value):
    """A float array, or a NumPy float scalar (what indexing or adding 0-d arrays gives)."""
    return isinstance(value, (np.ndarray, np.floating)) and np.issubdtype(value.dtype, np.floating)


def _require_grad(values, fixed):
    """Which of the float arrays among `values` require grad: `fixed`, checked, or drawn (one at least)."""
    count = sum(map(_floating, values))
    if fixed is not None:
        if len(fixed) != count or not any(fixed):
            raise ValueError(f"check_gradients: requires_grad={fixed!r} for {count} drawn float arrays")
        return st.just(tuple(fixed))
    if count <= 1:
        return st.just((True,) * count)
    return st.lists(st.booleans(), min_size=count, max_size=count).filter(any).map(tuple)


# ----- each device, each path: for pytest

_ON_A_GPU = pytest.mark.skipif(not backend.cuda_available(), reason="no CUDA device with CuPy here")
DEVICES = ["cpu", "cuda-emulated", pytest.param("cuda", marks=_ON_A_GPU)]
"""@pytest.mark.parametrize("device", DEVICES): the CPU, the CUDA kernels on the CPU, a GPU (or a skip)."""


@pytest.fixture(params=["fast", "reference"])
def each_path(request):
    """Runs a test once with every op on its fast path where it has one, once on its reference.
    A test module takes it with `pytestmark = pytest.mark.usefixtures("each_path")`, once imported
    (`from autograd.testing import each_path`) into the module or its conftest.py."""
    with use_reference(request.param == "reference"):
        yield request.param


# ----- which Function has a gradient test ------------------------------------------------------

_TESTED = {"gradient": set(), "fast path": set()}  # for each check, the Functions a test marks


def checks_gradient_of(*functions):
    """Mark a test as the gradient test of these Function subclasses."""
    return _mark("gradient", functions)


def checks_fast_path_of(*functions):
    """Mark a test as the one that compares these Function subclasses' fast paths with their references."""
    return _mark("fast path", functions)


def _mark(check, functions):
    wrong = [f for f in functions if not (isinstance(f, type) and issubclass(f, Function))]
    if wrong:
        marker = f"checks_{check.replace(' ', '_')}_of"
        raise TypeError(f"{marker}: takes Function subclasses, not {', '.join(map(repr, wrong))}")
    _TESTED[check].update(functions)
    return lambda test: test


def functions_of(package):
    """The Function subclasses defined in `package` (a module or a package), every module of it
    imported first."""
    _check_module("package", package)
    _import_all(package)
    return {f for f in _subclasses(Function) if _defined_in(f, package)}


def untested_functions(package, tests=None, check="gradient"):
    """Names of the Function subclasses of `package` that no test marks for `check`: "gradient"
    (`checks_gradient_of`) or "fast path" (`checks_fast_path_of`, of those with a forward_cpu or a
    forward_gpu); every module of `tests` is imported first, so that every mark is seen."""
    if check not in list(_TESTED):  # a list: an unhashable `check` is refused as any other
        raise ValueError(f"untested_functions: check is {' or '.join(map(repr, _TESTED))}, not {check!r}")
    _check_module("tests", tests, optional=True)
    _import_all(tests)
    functions = functions_of(package)
    if check == "fast path":
        functions = {f for f in functions if f.forward_cpu is not None or f.forward_gpu is not None}
    return sorted(f"{f.__module__}.{f.__qualname__}" for f in functions - _TESTED[check])


def assert_every_function_tested(package, tests=None, check="gradient"):
    """Fail naming every Function subclass of `package` that no test in `tests` marks for `check`."""
    missing = untested_functions(package, tests, check)
    assert not missing, f"no {check} test for: {', '.join(missing)}"


def _check_module(name, value, optional=False):
    if not (isinstance(value, types.ModuleType) or optional and value is None):
        raise TypeError(f"{name} must be a module or package (such as autograd), not {value!r}")


def _import_all(module):
    """Import every module inside a package (a module alone, or None, has none to import)."""
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), getattr(module, "__name__", "") + "."):
        importlib.import_module(info.name)


def _defined_in(function, package):
    return function.__module__ == package.__name__ or function.__module__.startswith(package.__name__ + ".")


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)
