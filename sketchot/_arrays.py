"""Where the caller's arrays live: their library, device and dtype (the Array API boundary).

A call with PyTorch tensors (or any library implementing the Python Array API standard:
CuPy, JAX, ...; recognised by ``array-api-compat``, as SciPy and scikit-learn do) is solved
with its points' products on that device where a kernel can (see
:mod:`sketchot.kernels.device`) and answers in the same library, on the same device, in the
points' floating dtype: the :class:`ArrayContext` of the inputs records where they live,
:meth:`ArrayContext.to_host` gives the solver its float64 host view (no copy for CPU
tensors), and :meth:`ArrayContext.wrap` shows a result in the caller's arrays.

Nothing here imports PyTorch: a library is recognised from the type of an array the caller
passed, so ``import sketchot`` never loads it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._memory import available_bytes

#: Result types whose attributes are scalars or strings; they pass through unchanged.
_PLAIN = (str, bytes, bool, int, float, complex, type(None), dict, slice)


def _library(value: Any) -> str | None:
    """The array library of ``value`` (``None`` for NumPy arrays, lists and scalars)."""
    if value is None or isinstance(value, (np.ndarray, np.generic, *_PLAIN, list)):
        return None
    root = type(value).__module__.split(".")[0]
    if root in ("dask", "numpy"):
        return None
    if root == "torch" or hasattr(value, "__array_namespace__"):
        return _LIBRARY_NAMES.get(root, root)
    return None


#: Module roots of array types whose library goes by another name (JAX's arrays are
#: ``jaxlib`` objects).
_LIBRARY_NAMES = {"jaxlib": "jax"}

#: Libraries whose arrays always take the device operators, in host memory too: their
#: arrays may live on any of their devices, and NumPy views would bypass the library (JAX).
DEVICE_CODE_LIBRARIES = ("jax",)

#: Libraries whose arrays cannot be written in place (:meth:`DeviceArrays.assign`).
IMMUTABLE_LIBRARIES = ("jax",)

#: Whether arrays in host memory of another library than NumPy (CPU tensors, the standard's
#: strict arrays) take the device operators (:mod:`sketchot.kernels.device`), as arrays on an
#: accelerator do. Off: NumPy's operators run on zero-copy views of them, threaded and faster
#: on the CPU than the library's own blocks (``benchmarks/results/gpu_cpu_tensors.md``); the
#: tests and ``benchmarks/float32.py`` turn it on to run the device code where there is no GPU.
#: Read when a call's :class:`ArrayContext` is made (:func:`array_context`), never later.
HOST_ARRAYS_ON_DEVICE = False


@dataclass(frozen=True)
class ArrayContext:
    """The library, device and floating dtype of the caller's arrays.

    Attributes
    ----------
    library : str
        ``'numpy'``, ``'torch'``, ``'cupy'``, ...
    xp : module
        The library's Array API namespace (``array_api_compat.array_namespace``).
    device : object
        The device of the inputs (``'cpu'`` for NumPy).
    dtype : object
        The floating dtype of results (the points' own when they are float32 or float64,
        else float64), in the library's dtype objects.
    device_kernels : bool
        Whether kernels run their products on :attr:`device` through :attr:`xp` (the device
        operators of :mod:`sketchot.kernels.device`) rather than NumPy's on host views:
        arrays off the host, JAX's arrays anywhere (:data:`DEVICE_CODE_LIBRARIES`), other
        host arrays with :data:`HOST_ARRAYS_ON_DEVICE`. Fixed when the context is made.
    float64 : bool
        Whether the library holds float64 arrays on :attr:`device` (JAX does only with
        ``jax_enable_x64``): the device operators compute in float32 otherwise.
    """

    library: str
    xp: Any
    device: Any
    dtype: Any
    device_kernels: bool = False
    float64: bool = True

    def __reduce__(self) -> tuple[Any, ...]:
        # the namespace by its module's name (a module does not pickle): results that hold
        # a context travel to Dask workers and process pools
        fields = (self.device, self.dtype, self.device_kernels, self.float64)
        return (_context_of, (self.library, self.xp.__name__, *fields))

    @property
    def is_numpy(self) -> bool:
        """Whether the caller passed NumPy arrays (nothing to convert)."""
        return self.library == "numpy"

    @property
    def on_host(self) -> bool:
        """Whether the arrays are in host memory (NumPy, or a CPU device)."""
        return self.is_numpy or "cpu" in str(self.device).lower()

    def to_host(self, value: Any) -> Any:
        """A NumPy view of one of the caller's arrays (a copy only off the host or for a dtype
        NumPy lacks); a :class:`UserArrays` view, its object; anything else unchanged."""
        if isinstance(value, UserArrays):
            return value.host
        if _library(value) != self.library:
            return value
        if self.library == "torch":
            value = value.detach()
            native = str(value.dtype) in ("torch.float32", "torch.float64")
            if value.is_complex() or not value.is_floating_point() or native:
                return value.cpu().numpy()
            return value.cpu().double().numpy()  # float16 / bfloat16: NumPy lacks bfloat16
        try:
            return np.from_dlpack(self.xp.asarray(value, device="cpu"))
        except (TypeError, ValueError, BufferError, RuntimeError, AttributeError):
            return np.asarray(value)

    def to_user(self, value: np.ndarray) -> Any:
        """A NumPy array in the caller's library on their device (floating arrays in
        :attr:`dtype`)."""
        if self.is_numpy:
            return value
        value = np.require(value, requirements="C")  # keeps 0-d values 0-d
        if self.library == "torch":
            import torch  # the caller passed a tensor: torch is loaded already

            tensor = torch.from_numpy(value)
            if tensor.is_floating_point():
                return tensor.to(device=self.device, dtype=self.dtype)
            return tensor.to(device=self.device)
        array = self.xp.asarray(value, device=self.device)
        if np.issubdtype(value.dtype, np.floating):
            array = self.xp.astype(array, self.dtype)
        return array

    def wrap(self, value: Any) -> Any:
        """``value`` as the caller sees it: arrays in their library, sketchot objects
        (results, plans, kernels) behind a :class:`UserArrays` view; scalars unchanged."""
        if self.is_numpy or isinstance(value, _PLAIN):
            return value
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return self.to_user(value)
        if isinstance(value, (tuple, list)):
            items = [self.wrap(item) for item in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if type(value).__module__.split(".")[0] == "sketchot":
            return value if isinstance(value, UserArrays) else UserArrays(value, self)
        return value

    def call(self, func: Callable, *args: Any, **kwargs: Any) -> Any:
        """``func`` on host views of the arguments, its answer wrapped."""
        args = tuple(self.to_host(arg) for arg in args)
        kwargs = {name: self.to_host(arg) for name, arg in kwargs.items()}
        return self.wrap(func(*args, **kwargs))


class DeviceArrays:
    """Host <-> device moves of one context (float64 on the way in unless told)."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.xp = context.xp

    def put(self, array: np.ndarray, dtype: Any = np.float64) -> Any:
        if not self.context.float64 and np.dtype(dtype) == np.float64:
            dtype = np.float32  # the library's widest float here (JAX without x64)
        array = np.ascontiguousarray(array, dtype=dtype)
        if self.context.library == "torch":
            import torch  # the caller passed a tensor: torch is loaded already

            return torch.from_numpy(array).to(self.context.device)
        return self.xp.asarray(array, device=self.context.device)

    def get(self, array: Any) -> np.ndarray:
        return np.asarray(self.context.to_host(array), dtype=np.float64)

    def float_dtype(self, dtype: Any = np.float64) -> Any:
        """The library's dtype for the NumPy floating ``dtype`` (float32 for float64 where
        the library holds no float64: JAX without ``jax_enable_x64``)."""
        name = np.dtype(dtype).name
        if name == "float64" and not self.context.float64:
            name = "float32"
        return getattr(self.xp, name)

    def assign(self, target: Any, index: Any, value: Any) -> Any:
        """``target[index] = value``: in place where the library's arrays are mutable
        (NumPy, PyTorch, CuPy), as a new array where they are not (JAX's ``.at[].set``;
        ``O(target.size)``). The caller keeps the array returned."""
        if self.context.library in IMMUTABLE_LIBRARIES:
            return target.at[index].set(value)
        target[index] = value
        return target

    def free_bytes(self) -> int | None:
        """Bytes free on the context's device now: the host's available memory for arrays
        in host memory, a CUDA device's free memory for torch (asked through torch), ``None``
        where this module cannot ask (another library's accelerator)."""
        if self.context.on_host:
            return available_bytes()
        if self.context.library == "torch" and str(self.context.device).startswith("cuda"):
            import torch  # the caller's arrays are CUDA tensors: torch is loaded already

            return int(torch.cuda.mem_get_info(self.context.device)[0])
        return None


NUMPY = ArrayContext("numpy", np, "cpu", np.dtype(np.float64))


def _context_of(library: str, namespace: str, *fields: Any) -> ArrayContext:
    """An unpickled :class:`ArrayContext`: its namespace imported again by name."""
    import importlib

    return ArrayContext(library, importlib.import_module(namespace), *fields)


def array_context(**arrays: Any) -> ArrayContext:
    """The :class:`ArrayContext` of the named inputs (``None`` entries ignored; a list or
    tuple counts by its items; a :class:`UserArrays` view by the context it was made in).

    Raises
    ------
    TypeError
        When the inputs mix array libraries or devices, naming the arguments.
    """
    found: dict[str, Any] = {}
    views: dict[str, ArrayContext] = {}
    for name, value in arrays.items():
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            if isinstance(item, UserArrays):
                views.setdefault(name, item._context)
            elif _library(item) is not None:
                found.setdefault(name, item)
    if not found:
        contexts = list(views.values())
        return contexts[0] if contexts else NUMPY
    from array_api_compat import array_namespace, device

    names = list(found)
    libraries = {name: _library(found[name]) for name in names}
    if "jax" in libraries.values():
        _refuse_tracers(found)
    libraries.update({name: context.library for name, context in views.items()})
    if len(set(libraries.values())) > 1:
        listed = ", ".join(f"{name} ({lib})" for name, lib in libraries.items())
        raise TypeError(f"the arrays must come from one library; got {listed}")
    devices = {name: device(found[name]) for name in names}
    devices.update({name: context.device for name, context in views.items()})
    if len({str(d) for d in devices.values()}) > 1:
        listed = ", ".join(f"{name} on {d}" for name, d in devices.items())
        raise TypeError(f"the arrays must live on one device; got {listed}")
    library = libraries[names[0]]
    xp = array_namespace(*found.values())
    float64 = _holds_float64(library)
    # results take the points' floating dtype (the first named matrix that has one)
    dtype = xp.float64 if float64 else xp.float32
    for value in found.values():
        if getattr(value, "dtype", None) in (xp.float32, xp.float64) and value.ndim == 2:
            dtype = value.dtype
            break
    on = devices[names[0]]
    on_host = "cpu" in str(on).lower()
    device_kernels = (not on_host) or library in DEVICE_CODE_LIBRARIES or HOST_ARRAYS_ON_DEVICE
    return ArrayContext(library, xp, on, dtype, device_kernels, float64)


def _refuse_tracers(arrays: dict[str, Any]) -> None:
    """JAX's transformations (``jax.grad``, ``jit``, ``vmap``) pass tracers, which hold no
    numbers: a solve needs concrete arrays (it runs eagerly, on the host and the device)."""
    import jax  # the caller passed JAX arrays: jax is loaded already

    for name, value in arrays.items():
        if isinstance(value, jax.core.Tracer):
            raise TypeError(
                f"{name} is a JAX tracer (the call is inside jax.grad, jax.jit or jax.vmap): "
                "sketchot solves concrete arrays eagerly and cannot be traced; call it "
                "outside the transformation, or through jax.pure_callback for values "
                "without gradients"
            )


def _holds_float64(library: str) -> bool:
    """Whether ``library`` makes float64 arrays (JAX only with ``jax_enable_x64``; it rounds
    float64 inputs to float32 otherwise)."""
    if library != "jax":
        return True
    import jax  # the caller passed JAX arrays: jax is loaded already

    return bool(jax.config.read("jax_enable_x64"))


class UserArrays:
    """A sketchot object seen in the caller's array library.

    Attributes and method results that are NumPy arrays come back as the caller's arrays on
    their device; arguments the caller passes in their arrays reach the object as host views.
    ``isinstance`` sees the wrapped object's class; :attr:`host` is the object itself.
    """

    __slots__ = ("_context", "_host")

    def __init__(self, host: Any, context: ArrayContext) -> None:
        object.__setattr__(self, "_host", host)
        object.__setattr__(self, "_context", context)

    @property
    def host(self) -> Any:
        """The wrapped object, with NumPy arrays."""
        return self._host

    @property  # isinstance(view, SinkhornResult) holds, as for the object itself
    def __class__(self) -> type:  # type: ignore[override]
        return type(self._host)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._host, name)
        if inspect.ismethod(value) or (callable(value) and not isinstance(value, type)):
            if type(value).__module__.split(".")[0] == "sketchot" and not inspect.isroutine(value):
                return self._context.wrap(value)
            return functools.partial(self._context.call, value)
        return self._context.wrap(value)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._host, name, self._context.to_host(value))

    def __dir__(self) -> list[str]:
        return dir(self._host)

    def __repr__(self) -> str:
        return repr(self._host)

    def __len__(self) -> int:
        return len(self._host)

    def __iter__(self):
        return (self._context.wrap(item) for item in self._host)

    def __getitem__(self, key: Any) -> Any:
        return self._context.wrap(self._host[key])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._context.call(self._host, *args, **kwargs)


def in_user_arrays(*names: str, scalar: bool = False, refuse_gradients: bool = False) -> Callable:
    """Decorator of a public function: the arguments ``names`` (arrays, or lists of arrays)
    decide the :class:`ArrayContext`; the function runs on host views of every argument and
    is passed the context explicitly as its keyword-only ``_arrays`` argument when it declares
    one (the placement its geometries take: no hidden state; a layer of sketchot that passes
    ``_arrays`` itself passes host views), and its answer comes back in the caller's library
    (:meth:`ArrayContext.wrap`; with ``scalar=True`` a number comes back as a 0-d array, as
    POT's backends return values). ``refuse_gradients``: a tensor that requires grad
    is refused by name (the answer would carry no gradient: autograd would fail far from the
    cause, or a loss built on it would silently miss a term)."""

    def decorate(func: Callable) -> Callable:
        signature = inspect.signature(func)
        takes_context = "_arrays" in signature.parameters

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            explicit = kwargs.pop("_arrays", None)
            if explicit is not None:  # a layer of sketchot passing host views and placement
                return func(*args, **kwargs, **({"_arrays": explicit} if takes_context else {}))
            bound = signature.bind_partial(*args, **kwargs)
            context = array_context(**{n: bound.arguments.get(n) for n in names})
            if context.is_numpy:
                return func(*args, **kwargs)
            if scalar or refuse_gradients:
                _refuse_gradients(func.__name__, {n: bound.arguments.get(n) for n in names})
            for name in names:
                value = bound.arguments.get(name)
                if isinstance(value, (tuple, list)):
                    bound.arguments[name] = type(value)(context.to_host(v) for v in value)
                elif name in bound.arguments:
                    bound.arguments[name] = context.to_host(value)
            if takes_context:
                bound.arguments["_arrays"] = context
            answer = func(*bound.args, **bound.kwargs)
            if scalar and isinstance(answer, (float, np.floating)):
                return context.to_user(np.asarray(answer, dtype=np.float64))
            return context.wrap(answer)

        if takes_context:  # the placement is the decorator's to pass, not the caller's
            public = [p for p in signature.parameters.values() if p.name != "_arrays"]
            wrapper.__signature__ = signature.replace(parameters=public)
        return wrapper

    return decorate


def _refuse_gradients(function: str, arrays: dict[str, Any]) -> None:
    """A number returned without its gradient would break ``backward()`` far from the cause."""
    for name, value in arrays.items():
        items = value if isinstance(value, (tuple, list)) else [value]
        if any(getattr(item, "requires_grad", False) for item in items):
            raise TypeError(
                f"{name} requires grad, and sketchot.{function} returns its values without a "
                "gradient: for OT(a, b) with autograd use sketchot.nn.sinkhorn_divergence(X, Y, "
                "a, b, reg=..., debias=False) (or debias=True for the divergence), or pass "
                f"{name}.detach() to solve without gradients"
            )
