"""Tensor and Function: arrays that remember the ops that made them, and backpropagation.

A `Function` is one op with its forward and backward side by side, both on raw NumPy/CuPy
arrays. `Function.apply` runs the forward and, when gradients are wanted, records a `Node`
(the op, its saved context, its input tensors) on the output. `Tensor.backward` walks those
nodes from the output back to the leaves, adding each input's gradient as it goes.
"""

import functools
import inspect
import reprlib
import weakref

import numpy as np

from . import backend, kernels
from .precision import bfloat16, is_floating, is_numeric

_grad_enabled = True


class no_grad:
    """Context manager and decorator: ops inside it record no graph (evaluation, weight updates)."""

    def __init__(self):
        self._previous = []

    def __enter__(self):
        global _grad_enabled
        self._previous.append(_grad_enabled)
        _grad_enabled = False

    def __exit__(self, *exc_info):
        global _grad_enabled
        _grad_enabled = self._previous.pop()

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return wrapper


def is_grad_enabled():
    return _grad_enabled


class Context:
    """What a forward leaves for its backward: `needs_input_grad` plus whatever it saves on it."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad


class Function:
    """A differentiable op. Subclasses write two static methods on raw arrays:

    forward(ctx, *args, **attrs) -> the output array, or a tuple of them; it may save on ctx what
        backward needs.
    backward(ctx, *grads) -> one gradient per positional arg (a tuple, or the array alone for one
        arg); None where an arg has no gradient or ctx.needs_input_grad says it is not wanted.
        It gets one gradient per output, zeros for an output no gradient reached, and never writes
        into them: the same array may flow to other inputs too.

    Positional args that are Tensors are the graph inputs; anything else (numbers, index arrays)
    reaches forward as it is. These two are the reference; a heavy op may also name fast paths
    with the same arguments, forward_cpu/backward_cpu and forward_gpu/backward_gpu, and the calls
    they take, fits_cpu/fits_gpu(*args, **attrs), which `kernels.choose` picks from (see
    autograd/kernels).

    Two promises about what backward returns let the engine add gradients in place rather than
    allocate their sums: `returns_new_arrays` (arrays of its own making, each once: never `grad`,
    views of it, or arrays kept elsewhere) and `returns_view_of_grad` (a view of `grad` for its
    one input, as reshape and transpose do). Both paths of an op keep its promises.

    An output used several times gets the sum of the gradients its uses give. An op that says
    `sums_gradients` gets them apart instead, a list in the order they came, and sums them itself:
    its fast path adds them in a kernel that reads them anyway (the residual layer norm, whose output
    a block uses twice), where the sum would be a pass of its own.

    An op's floating inputs share one type, which its output keeps; only an op that says
    `mixes_floats` takes several (bfloat16 activations with float32 weights, autograd/precision.py)
    and gives the output type it chooses. A bfloat16 result that NumPy promoted to float32 (as
    bfloat16 times a Python number is) becomes bfloat16 again.
    """

    returns_new_arrays = False
    returns_view_of_grad = False
    mixes_floats = False
    sums_gradients = False
    forward_cpu = backward_cpu = forward_gpu = backward_gpu = fits_cpu = fits_gpu = None

    @classmethod
    def apply(cls, *args, **attrs):
        keywords = [name for name, value in attrs.items() if isinstance(value, Tensor)]
        if keywords:
            raise TypeError(
                f"{cls.__name__}.apply: pass {keywords[0]}= by position: a keyword is not a graph input"
            )
        tensors = [a for a in args if isinstance(a, Tensor)]
        float_dtype = _common_float_dtype(cls, tensors)
        on_gpu = any(backend.on_gpu(t._data) for t in tensors)
        arrays = [a._data if isinstance(a, Tensor) else a for a in args]
        dtypes = {t.dtype for t in tensors if is_floating(t.dtype)}
        forward, backward = kernels.choose(cls, on_gpu, dtypes, arrays, attrs)
        ctx = Context(tuple(isinstance(a, Tensor) and a.requires_grad for a in args))
        with backend.device_scope(tensors[0]._data if tensors else None):  # the inputs' GPU
            out = forward(ctx, *arrays, **attrs)
        several = isinstance(out, tuple)
        if several and not out:
            raise TypeError(f"{cls.__name__}.forward gave an empty tuple: give an array, or a tuple of them")
        given = out if several else (out,)
        outs = [_checked_output(cls, o, i, float_dtype, tensors) for i, o in enumerate(given)]
        requires_grad = _grad_enabled and any(ctx.needs_input_grad)
        results = tuple(Tensor(o, requires_grad=requires_grad) for o in outs)
        if requires_grad:
            inputs = tuple(a if isinstance(a, Tensor) else None for a in args)
            node = Node(cls, backward, ctx, inputs, results)
            for result in results:  # held by its node too, whose backward may read it (Exp's does)
                result._node, result._holders = node, 1
        return results if several else results[0]


def _checked_output(function, out, i, float_dtype, tensors):
    """Output i of function's forward, an array of the inputs' floating type (bfloat16 again where
    NumPy promoted it); a TypeError that names the op and the output for anything else."""
    out, what = _as_array(out), f"output {i}" if i else "output"
    if not _is_array(out):
        raise TypeError(
            f"{function.__name__}.forward gave a {type(out).__name__} as its {what}: give an array, or a "
            "tuple of them (forward works on raw arrays)"
        )
    out = _unpromoted(out, float_dtype)
    if float_dtype is not None and out.dtype != float_dtype:
        others = ", ".join(sorted({str(t.dtype) for t in tensors if t.dtype != float_dtype}))
        raise TypeError(
            f"{function.__name__}: {float_dtype} inputs gave a {out.dtype} {what}"
            + (f" (a {others} tensor is among them: convert it to {float_dtype} first)" if others else "")
        )
    return out


class Node:
    """An op in the graph: the Function, the backward chosen with its forward, what that forward
    saved, the op's inputs (None where not a Tensor) and their versions at the forward, and its
    outputs (weakly: each output holds its node).

    Until it is freed, a node holds its inputs and its outputs (Tensor._holders): their arrays are
    what its backward may read, so it refuses to run when one of them has changed since."""

    def __init__(self, function, backward, ctx, inputs, outputs):
        self.function, self.backward, self.ctx, self.inputs = function, backward, ctx, inputs
        self.versions = [None if t is None else t._hold() for t in inputs]
        self.outputs = [(weakref.ref(t), t.shape, t.dtype) for t in outputs]

    def output_tensors(self):
        """The outputs, None for one no longer alive (nothing used it, so no gradient reached it)."""
        return [output() for output, _, _ in self.outputs]

    def input_grads(self, grads):
        """(input, its gradient) for every input that wants one, given the outputs' gradients (None
        for an output that got none)."""
        if self.ctx is None:
            raise RuntimeError("backward() through a graph that an earlier backward() has freed")
        for i, (t, version) in enumerate(zip(self.inputs, self.versions)):
            if t is not None and t._changed_since(version):
                raise self._changed(f"argument {self.argument(i)}", t)
        for i, t in enumerate(self.output_tensors()):
            if t is not None and t._changed_since(0):
                raise self._changed(f"output {i}" if i else "output", t)
        if len(grads) > 1:  # several outputs: zeros for those no gradient reached
            xp = backend.get_array_module(next(g for g in grads if g is not None))
            grads = [xp.zeros(s, dtype) if g is None else g for g, (_, s, dtype) in zip(grads, self.outputs)]
        # NumPy's grads are read-only while the backward runs, so that one that writes into them fails (CuPy's
        # have no such flag); but for an op that returns a view of its grad, which the engine may add into
        lockable = [] if self.function.returns_view_of_grad else grads
        locked = [g for g in lockable if isinstance(g, np.ndarray) and g.flags.writeable]
        try:
            for g in locked:
                g.flags.writeable = False
            given = self.backward(self.ctx, *grads)
        except ValueError as error:  # NumPy's "output array is read-only", without a name
            if "read-only" not in str(error):
                raise
            raise RuntimeError(
                f"{self.function.__name__}.backward wrote into a read-only array ({error}): a backward never "
                "writes into its grad, which other ops may share: make a new array (grad * 2, not grad *= 2)"
            ) from None
        finally:
            for g in locked:
                g.flags.writeable = True
        given = given if isinstance(given, tuple) else (given,)
        if len(given) != len(self.inputs) or not all(g is None or _is_array(g) for g in given):
            kinds = ", ".join(type(g).__name__ for g in given)
            name, count = self.function.__name__, len(self.inputs)
            each = "an array or None per positional arg"
            raise TypeError(f"{name}.backward gave ({kinds}): give a tuple of {count}: {each}")
        for i, (inp, g) in enumerate(zip(self.inputs, given)):
            if inp is None or g is None or not inp.requires_grad:
                continue
            g = _unpromoted(g, inp.dtype)
            if g.shape != inp.shape or g.dtype != inp.dtype:
                raise RuntimeError(
                    f"{self.function.__name__}.backward gave a {g.dtype} {g.shape} gradient for argument "
                    f"{self.argument(i)}, a {inp.dtype} {inp.shape} tensor"
                )
            yield inp, g

    def argument(self, i):
        """The name of the op's i-th positional argument, as its forward calls it (else its index)."""
        parameters = inspect.signature(self.function.forward).parameters.values()
        names = [p.name for p in parameters if p.kind <= p.POSITIONAL_OR_KEYWORD][1:]  # after ctx
        return names[i] if i < len(names) else str(i)

    def gives_own_arrays(self, grads_are_own):
        """Whether the gradients it hands on are the pass's to write into (see Function)."""
        return self.function.returns_new_arrays or self.function.returns_view_of_grad and grads_are_own

    def _changed(self, what, t):
        return RuntimeError(
            f"{self.function.__name__}'s {what} (a {t.dtype} {t.shape} tensor) was changed in place after "
            "the forward; the gradient would be wrong: change a copy, or run the forward after the change"
        )

    def free(self):
        """Let go of what the forward saved and of the tensors held."""
        for t in () if self.inputs is None else (*self.inputs, *self.output_tensors()):
            if t is not None:
                t._holders -= 1
                if not t._holders:
                    t._snapshot = None
        self.ctx = self.inputs = None

    __del__ = free  # a graph dropped without a backward lets go of its tensors as well


def _read_only(array):
    return isinstance(array, np.ndarray) and not array.flags.writeable


def _is_array(x):
    return hasattr(x, "shape") and not isinstance(x, Tensor)


def _as_array(x):
    """NumPy gives a scalar, not a 0-d array, for some 0-d results; make it an array again."""
    return np.asarray(x) if isinstance(x, np.generic) else x


def _unpromoted(array, dtype):
    """`array` of float32 that bfloat16 inputs gave (NumPy promotes bfloat16 times a Python number
    to float32) as bfloat16 again; any other array as it is."""
    return array.astype(bfloat16) if dtype == bfloat16 and array.dtype == np.float32 else array


def _common_float_dtype(function, tensors):
    """The one floating dtype of an op's tensor inputs (None for an op that mixes them); mixing
    dtypes otherwise, or devices, is refused."""
    if len(tensors) > 1 and len({t.device for t in tensors}) > 1:
        devices = ", ".join(t.device for t in tensors)
        raise RuntimeError(f"{function.__name__}: inputs are on different devices ({devices})")
    if function.mixes_floats:
        return None
    dtypes = {t.dtype for t in tensors if is_floating(t.dtype)}
    if len(dtypes) > 1:
        names = ", ".join(sorted(str(d) for d in dtypes))
        raise TypeError(f"{function.__name__}: inputs mix floating dtypes ({names}); convert one first")
    return dtypes.pop() if dtypes else None


def _operator_and_reflection(op):
    """Tensor's methods for `self - other` and its reflection `other - self` (Python calls x.__rsub__(2) for
    2 - x), for the binary op named `op` in ops: a name, as ops is imported last."""

    def operator(self, other):
        return getattr(ops, op).apply(self, self._operand(other))

    def reflection(self, other):
        return getattr(ops, op).apply(self._operand(other), self)

    return operator, reflection


class Tensor:
    """An array (`.data`, numpy or cupy) with an optional gradient (`.grad`, same shape).

    Setting `.data` (`x.data = y`, `x.data -= 1`) or an optimizer step counts a new version. A write
    into the array `.data` gives (`x.data[0] += 1`) counts none, so reading `.data` while a live
    graph holds the tensor keeps a copy to compare with at backward. The engine reads `_data`.
    """

    __array_ufunc__ = None  # make `ndarray + Tensor` call Tensor.__radd__ instead of numpy
    __array_priority__ = 1000  # the same for cupy
    _version = 0  # how many times the array was set anew or stepped in place
    _holders = 0  # the live nodes that hold this tensor (Node)
    _snapshot = None  # the array as the graph saw it, kept while one holds it and `.data` is read
    _kept = None  # (version, a bfloat16 copy of the array made at that version): precision.kept_cast

    def __init__(self, data, requires_grad=False):
        if not isinstance(requires_grad, (bool, np.bool_)):
            raise TypeError(f"requires_grad must be True or False, not {requires_grad!r}")
        if requires_grad and not is_floating(data.dtype):
            raise TypeError(f"only floating tensors can require gradients, not {data.dtype}")
        self._data = data
        self.grad = None
        self.requires_grad = requires_grad
        self._node = None

    @property
    def data(self):
        """The array itself (not a copy). A write into it may follow: a copy kept of it is let go."""
        if self._holders and self._snapshot is None:
            self._snapshot = _copy(self._data)
        self._kept = None
        return self._data

    @data.setter
    def data(self, array):
        self._data, self._snapshot, self._kept = array, None, None
        self._version += 1

    def _hold(self):
        """One more live node holds this tensor: its version, for the node to keep. An array written
        since `.data` was read gets a new version first, which the older nodes will refuse."""
        if self._snapshot is not None and self._written_into():
            self._version, self._snapshot = self._version + 1, _copy(self._data)
        self._holders += 1
        return self._version

    def _changed_since(self, version):
        return self._version != version or self._snapshot is not None and self._written_into()

    def _written_into(self):
        """Whether the array differs from the copy kept when `.data` was read (NaN equals NaN)."""
        with backend.device_scope(self._data):
            same = self.xp.array_equal(self._snapshot, self._data, equal_nan=is_floating(self.dtype))
        return not backend.to_host(same)

    # ----- what it is
    shape = property(lambda self: self._data.shape)
    ndim = property(lambda self: self._data.ndim)
    size = property(lambda self: self._data.size)
    dtype = property(lambda self: self._data.dtype)
    device = property(lambda self: backend.device_of(self._data))
    xp = property(lambda self: backend.get_array_module(self._data))
    is_leaf = property(lambda self: self._node is None)

    def __len__(self):
        return len(self._data)

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({backend.to_host(self._data)!r}, device='{self.device}'{grad})"

    def numpy(self):
        """A host copy of the data as a NumPy array (on a GPU, a read that waits for it)."""
        return backend.to_host(self._data).copy()

    def item(self):
        """The one value of a one-entry tensor as a Python number (a read, as numpy())."""
        return backend.to_host(self._data).item()

    def detach(self):
        """The same data, cut off from the graph."""
        return Tensor(self.data)

    # ----- arithmetic; numbers stay numbers, arrays take this tensor's dtype
    def _operand(self, other):
        if isinstance(other, Tensor) or type(other) in (int, float, bool):
            return other
        return backend.to_device(other, self.device, self.dtype)

    __add__, __radd__ = _operator_and_reflection("Add")
    __sub__, __rsub__ = _operator_and_reflection("Sub")
    __mul__, __rmul__ = _operator_and_reflection("Mul")
    __truediv__, __rtruediv__ = _operator_and_reflection("Div")
    __pow__, __rpow__ = _operator_and_reflection("Pow")
    __matmul__, __rmatmul__ = _operator_and_reflection("MatMul")

    def __neg__(self):
        return ops.Neg.apply(self)

    # comparisons give plain boolean tensors (masks for `where`), with no gradient
    def _compare(self, other, compare):
        other = other._data if isinstance(other, Tensor) else self._operand(other)
        with backend.device_scope(self._data):
            return Tensor(compare(self._data, other))

    # fmt: off
    def __lt__(self, other): return self._compare(other, self.xp.less)
    def __le__(self, other): return self._compare(other, self.xp.less_equal)
    def __gt__(self, other): return self._compare(other, self.xp.greater)
    def __ge__(self, other): return self._compare(other, self.xp.greater_equal)
    # fmt: on

    # ----- reductions and elementwise functions
    # fmt: off
    def sum(self, axis=None, keepdims=False): return ops.Sum.apply(self, axis=axis, keepdims=keepdims)
    def mean(self, axis=None, keepdims=False): return ops.Mean.apply(self, axis=axis, keepdims=keepdims)
    def max(self, axis=None, keepdims=False): return ops.Max.apply(self, axis=axis, keepdims=keepdims)
    def exp(self): return ops.Exp.apply(self)
    def log(self): return ops.Log.apply(self)
    def tanh(self): return ops.Tanh.apply(self)
    # fmt: on

    # ----- shape
    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return ops.Reshape.apply(self, shape=tuple(shape))

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return ops.Transpose.apply(self, axes=tuple(axes) or None)

    T = property(lambda self: self.transpose())

    def __getitem__(self, index):
        return ops.GetItem.apply(self, index=_raw_index(index))

    # ----- backpropagation
    def backward(self, grad=None):
        """Add d(self)/d(leaf) into `.grad` of every leaf that requires it, then free the graph.

        `grad` (shaped like self) is required unless self has one element; it weights the
        outputs, so backward(grad) gives the vector-Jacobian product.
        """
        with backend.device_scope(self._data):  # the graph's GPU: its ops' inputs share one device
            gradients = Gradients()
            gradients.add(self, self._output_grad(grad), own=False)
            order = _inputs_first(self)
            while order:  # from the end: each op and leaf comes after every op that used it
                item = order.pop()  # and is let go of, so what it holds is freed once nothing needs it
                if isinstance(item, Tensor):  # a leaf
                    grad, own = gradients.take(item)
                    if grad is not None:
                        gradients.give_to_leaf(item, grad, own)
                    continue
                node, outputs = item
                grads, owns = zip(*map(gradients.take, outputs))
                if any(g is not None for g in grads):
                    for inp, input_grad in node.input_grads(grads):
                        gradients.add(inp, input_grad, own=node.gives_own_arrays(all(owns)))
                node.free()

    def _output_grad(self, grad):
        """backward()'s `grad` as an array of this tensor's shape and dtype (ones by default)."""
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad (no graph leads to it)")
        if grad is None:
            if self.size != 1:
                raise RuntimeError(f"backward() on a tensor of shape {self.shape} needs grad= of that shape")
            grad = self.xp.ones(self.shape, dtype=self.dtype)
        else:
            grad = self.xp.array(grad._data if isinstance(grad, Tensor) else grad, dtype=self.dtype)
        if grad.shape != self.shape:
            raise ValueError(f"backward(): grad has shape {grad.shape}, the tensor {self.shape}")
        if isinstance(grad, np.ndarray):  # a backward that writes into it fails (CuPy's has no such flag)
            grad.flags.writeable = False
        return grad


class Gradients:
    """The gradients gathered for each tensor during one backward pass.

    A tensor used by several ops gets a gradient from each, summed here. The sum is made in place
    in an array that is the pass's own: one a backward made for this use alone, or a sum made
    here. Any other array may be shared (Add hands one gradient to both its inputs): it is read,
    never written.
    """

    def __init__(self):
        self._sums = {}  # id(tensor) -> the gradient gathered for it so far
        self._parts = {}  # id(tensor) -> its gradients apart, for an op that sums_gradients itself
        self._own = set()  # ids of the tensors whose gathered gradient is the pass's own
        self._given = set()  # ids of the arrays stored as a leaf's .grad in this pass

    def add(self, tensor, grad, own):
        """Add one more gradient for `tensor`; `own`: the pass may write into `grad`."""
        key = id(tensor)
        if tensor._node is not None and tensor._node.function.sums_gradients:
            self._parts.setdefault(key, []).append(grad)
            return
        if key not in self._sums:
            self._sums[key] = grad
        elif key in self._own:
            self._sums[key] += grad
        elif own:
            grad += self._sums[key]
            self._sums[key] = grad
        else:
            self._sums[key] = self._sums[key] + grad
            own = True
        if own:
            self._own.add(key)

    def take(self, tensor):
        """(the gradient gathered for `tensor`, whether it is the pass's own), forgetting both;
        (None, False) when no gradient reached it (or it is None); (the list of its gradients, False)
        for an output of an op that sums_gradients."""
        key = id(tensor)
        if key in self._parts:
            return self._parts.pop(key), False
        own = key in self._own
        self._own.discard(key)
        return _as_array(self._sums.pop(key, None)), own

    def give_to_leaf(self, leaf, grad, own):
        """Add into leaf.grad. The first time, store the array itself, or a copy where something
        else may share it (a view, or an array already given to another leaf)."""
        if leaf.grad is not None:
            leaf.grad += grad
            return
        shared = not own and (grad.base is not None or id(grad) in self._given or _read_only(grad))
        leaf.grad = grad.copy() if shared else grad
        self._given.add(id(leaf.grad))


def _inputs_first(root):
    """The leaves of the graph under root that require grad, and its ops as (Node, its outputs: a
    list that holds them), each after the ops its inputs came from."""
    order, visited, stack = [], set(), [(root, False)]
    while stack:  # iterative depth-first search: graphs may be deeper than the recursion limit
        t, inputs_done = stack.pop()
        if inputs_done:
            order.append(t if t._node is None else (t._node, t._node.output_tensors()))
            continue
        if id(t._node or t) in visited:  # the outputs of one op are visited once
            continue
        visited.add(id(t._node or t))
        stack.append((t, True))
        if t._node is not None and t._node.inputs is not None:
            stack.extend((i, False) for i in t._node.inputs if i is not None and i.requires_grad)
    return order


def _raw_index(index):
    """An index with Tensors replaced by their arrays (integer or boolean indices)."""
    if isinstance(index, Tensor):
        return index._data
    if isinstance(index, tuple):
        return tuple(i._data if isinstance(i, Tensor) else i for i in index)
    return index


def tensor(data, requires_grad=False, dtype=None, device=None):
    """A new Tensor holding a copy of `data` (number, list, numpy or cupy array).

    Floating data becomes float32 unless `dtype` says otherwise; integer and boolean data keep
    their kind. `device` is 'cpu', 'cuda', 'cuda:N' or 'auto'; by default, where the data is.
    Anything but numbers (text, None, a dict, ragged lists, an object array) is refused here.
    """
    given = data._data if isinstance(data, Tensor) else data
    data = given if isinstance(given, np.ndarray) or backend.on_gpu(given) else _host_array(given)
    if not is_numeric(data.dtype):
        raise TypeError(f"tensor: data must be numbers (bool, integer or float), not {reprlib.repr(given)}")
    if dtype is not None and not is_numeric(_as_dtype(dtype)):
        raise TypeError(f"tensor: dtype must be a bool, integer or float type, not {dtype!r}")
    device = backend.parse_device(device) if device is not None else backend.device_of(data)
    if dtype is None and is_floating(data.dtype):
        dtype = np.float32
    array = backend.to_device(data, device, dtype)
    return Tensor(array.copy() if array is given else array, requires_grad=requires_grad)


def _host_array(data):
    try:
        return np.asarray(data)
    except (TypeError, ValueError) as error:  # ragged lists
        raise ValueError(f"tensor: data must be numbers or nested lists of equal lengths ({error})") from None


def _as_dtype(dtype):
    """np.dtype(dtype), or None where it names none."""
    try:
        return np.dtype(dtype)
    except TypeError:
        return None


def _copy(array):
    with backend.device_scope(array):
        return array.copy()


# The one import circle of the engine, as in every define-by-run engine: Tensor's operators make
# ops, and ops are Functions of Tensors. Imported last, once Function and Tensor exist.
from . import ops  # noqa: E402
