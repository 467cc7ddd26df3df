"""Every workaround for a version of jax, jaxlib, XLA or pytensor, each behind an explicit check.

The floor is jax 0.10 (`pyproject.toml`): CI tests jax and jaxlib 0.10.2 (Python 3.11, pymc
5.28) and the newest for Python 3.12, now 0.12.1 (pymc 6.4). A workaround for a version below
the floor is deleted, not kept. Each one here says on which versions it was seen, and
`tests/test_compat.py` tests the path that each CI stack runs, so that a jax that fixes (or
changes) what it works around fails a test instead of keeping a stale workaround.

1. jaxlib before 0.11 can deadlock when all the CPU devices of a process run LAPACK kernels
   at once (`lapack_may_deadlock`): the shards run one after another.
2. XLA's CPU sort cannot be serialized once it has run (`unserializable_after_run`): such a
   step is serialized right after it is compiled.
3. XLA's CPU compiler hands some fusions to a kernel library, YNNPACK (`NO_LIBRARY_FUSIONS`
   turns them off for one executable; `library_reductions` reads them from the HLO text).
4. jax's batching rules for elementwise primitives are internal (`elementwise_batchers`):
   without them, `_jaxpr_eval` maps every equation with `jax.vmap`.
5. The primitive of a jitted call is named "jit" (`CALLS`; "pjit" before jax 0.7, below the
   floor).
6. jax hashes threefry on a CPU in a rolled loop, which runs slower than the same hash
   unrolled and, on jaxlib 0.12, on one thread (`unrolled_threefry`); `split_key_at` is one
   key of a split, hashed unrolled.
7. jax 0.12.1 passes a program's large constants as arguments, outside its text
   (`constants_in_program` keeps them in it); `const_args` reads what a compiled program
   holds apart.
8. `serialize_executable`'s pickled tuple gained a version and the constants in jax 0.12.1
   (`serialized_parts` reads both).
9. pytensor 2.38 (pymc 5.28) converts `erfcx` and `erfcinv` to JAX through
   tensorflow-probability, and raises without it (a `Censored` or `Truncated` normal's
   log-density); pytensor 3 converts them with jax's own functions (`special_conversions`,
   used where pytensor 2's own conversion fails).
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from typing import Any

__all__ = [
    "CALLS",
    "JAX_FLOOR",
    "LAPACK_PRIMITIVES",
    "LIBRARY_FUSION_MARK",
    "NO_LIBRARY_FUSIONS",
    "PREFER_VECTOR_WIDTH",
    "const_args",
    "constants_in_program",
    "elementwise_batchers",
    "jaxlib_version",
    "lapack_may_deadlock",
    "library_reductions",
    "serialized_parts",
    "special_conversions",
    "split_key_at",
    "splits_key_at",
    "UNROLLED_THREEFRY",
    "unrolled_threefry",
    "unserializable_after_run",
]

#: The oldest jax that the package supports: the oldest that CI tests.
JAX_FLOOR = (0, 10)


def _release(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "0.10.2" or "0.12.0.1"."""
    parts = []
    for part in text.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return parts[0], parts[1] if len(parts) > 1 else 0


def jaxlib_version() -> tuple[int, int]:
    """This process's jaxlib, as (major, minor)."""
    import jaxlib

    return _release(str(getattr(jaxlib, "__version__", "0")))


# 1. A deadlock of jaxlib 0.10's CPU client (docs/strategies.md, "A deadlock of jaxlib 0.10 on
#    few CPU devices"): seen on jaxlib 0.10.2, not on 0.11 or 0.12. Python 3.11 gets at most
#    jaxlib 0.10.

#: The first jaxlib in which all the CPU devices of a process may run LAPACK kernels at once.
LAPACK_DEADLOCK_FIXED_IN = (0, 11)
#: Primitives that run as batched LAPACK kernels on a CPU: Cholesky and LU deadlocked; eigh
#: and SVD take the same route and are included untested.
LAPACK_PRIMITIVES = frozenset({"cholesky", "lu", "eigh", "svd"})


def lapack_may_deadlock() -> bool:
    """Whether this jaxlib can deadlock when every CPU device runs LAPACK kernels at once."""
    return jaxlib_version() < LAPACK_DEADLOCK_FIXED_IN


# 2. XLA's CPU sort picks its comparator when it first runs, and an executable that has sorted
#    then fails to serialize ("`LessThan` is not serializable"): seen on jaxlib 0.10.2 and 0.12,
#    fixed in none that CI tests (docs/strategies.md, "`auto` keeps its own executables").

#: The first jaxlib whose CPU sort serializes after it ran; None: none that CI tests.
SORT_SERIALIZES_AFTER_RUN_IN: tuple[int, int] | None = None


def unserializable_after_run(platform: str) -> frozenset[str]:
    """Primitives whose compiled code on `platform` can be serialized only before its first
    run (for the on-disk store, or to move it to another device)."""
    fixed = SORT_SERIALIZES_AFTER_RUN_IN
    if platform != "cpu" or (fixed is not None and jaxlib_version() >= fixed):
        return frozenset()
    return frozenset({"sort"})


# 3. XLA's CPU library fusions (YNNPACK: `__ynn_fusion` in the compiled HLO). The compiler
#    option and the HLO text below are those of jaxlib 0.10.2 and 0.12. A jaxlib that drops the
#    experimental option rejects it when compiling ("No such compile option", a
#    `JaxRuntimeError`), which the tuner and the tuning cache read as "no trial"
#    (`_library_fusions`); one that renames the mark shows no library fusion (no trial).

#: Compiler options that turn every library fusion off, for one executable.
NO_LIBRARY_FUSIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
#: What marks a library fusion in the compiled HLO's text.
LIBRARY_FUSION_MARK = "__ynn_fusion"
#: XLA's CPU compile option for the preferred vector width in bits (`PlannerConfig.
#: random_vector_width`), an option of jaxlib 0.10.2 and 0.12.1 alike. A jaxlib that drops it
#: rejects it when compiling; the executor then compiles without it.
PREFER_VECTOR_WIDTH = "xla_cpu_prefer_vector_width"

_SHAPE = re.compile(r"%([\w.-]+) = \w+\[([\d,]*)\]")
_PARAM = re.compile(r"([\w.-]+): \w+\[([\d,]*)\]")
_REDUCE = re.compile(r"reduce\(%([\w.-]+),.*?dimensions=\{([\d,]*)\}")


def library_reductions(hlo_text: str) -> list[int]:
    """The elements summed into each result of every reduction that XLA handed to a kernel
    library, read from a compiled program's HLO text: the reduced dimensions of the
    reduction's operand, inside each computation that a `LIBRARY_FUSION_MARK` fusion calls."""
    called = set(re.findall(r"calls=%([\w.-]+)[^\n]*" + LIBRARY_FUSION_MARK, hlo_text))
    extents = []
    for block in hlo_text.split("\n\n"):
        head = block.lstrip().split(" ", 1)[0]
        if not head.startswith("%") or head[1:] not in called:
            continue
        dims = {name: shape for name, shape in _PARAM.findall(block.split("\n", 1)[0])}
        dims.update(_SHAPE.findall(block))
        for operand, reduced in _REDUCE.findall(block):
            shape = [int(d) for d in dims.get(operand, "").split(",") if d]
            axes = [int(a) for a in reduced.split(",") if a]
            if shape and all(a < len(shape) for a in axes):
                extents.append(math.prod(shape[a] for a in axes))
    return extents


# 4. jax's batching rules for elementwise primitives: `vectorized_batcher` (unary, every
#    operand batched), `broadcast_batcher` (n-ary with broadcasting) and the table of rules,
#    in `jax._src.interpreters.batching` on jax 0.10 and 0.12. No public API tells which rule a
#    primitive has; a jax that moves them loses only the cheaper tracing (the test of each CI
#    stack asserts that they are found).


def elementwise_batchers() -> tuple[Any, Any, dict]:
    """(unary rule, broadcasting rule, rules by primitive), or (None, None, {}) where this
    jax does not have them where jax 0.10-0.12 keep them."""
    try:
        from jax._src.interpreters import batching

        return (
            batching.vectorized_batcher,
            batching.broadcast_batcher,
            batching.fancy_primitive_batchers,
        )
    except (ImportError, AttributeError):
        return None, None, {}


# 5. Primitives that call a closed jaxpr (param "jaxpr") and mean nothing more than that call:
#    jitted functions, "jit" since jax 0.7 (the floor is above the "pjit" of older jax).
CALLS = frozenset({"jit"})


# 6. jax lowers the threefry hash on a CPU as a loop of five steps (`use_rolled_loops=True` in
#    `jax._src.random.threefry2x32`, for compile time), which writes the two counter arrays
#    out at every step. XLA's CPU compiler of jaxlib 0.12 also runs that loop as one kernel
#    (`SmallWhileLoopHoistingPass`, the call marked `xla_cpu_small_call`), on one thread. The
#    same hash unrolled (jax's lowering for other platforms) fuses into the draw, and runs
#    faster on both (docs/predictive.md, "Random numbers"). `unrolled_threefry` is threefry
#    with that hash on a CPU: the same keys, splits and bits (tests/test_compat.py compares
#    them), built from jax's private threefry functions, as of jax 0.10.2 and 0.12. A jax that
#    moves them gives None, and the samplers keep jax's threefry.


#: The name (`str(jax.random.key_impl(key))`) of `unrolled_threefry`'s keys.
UNROLLED_THREEFRY = "fry_u"


@functools.cache
def unrolled_threefry() -> Any:
    """A PRNG implementation equal to jax's threefry2x32 bit for bit, whose random bits are
    hashed unrolled on a CPU (item 6); None where this jax lacks what it is built from."""
    import jax
    from jax import lax

    try:
        from jax._src.random import prng
        from jax._src.random import threefry2x32 as threefry

        rolled_bits = threefry.threefry_random_bits
        hash_unrolled = _unrolled_hash()
        counts = prng.iota_2x32_shape
        uint_dtypes = prng.UINT_DTYPES
        seed, split, fold_in = (
            threefry.threefry_seed,
            threefry.threefry_split,
            threefry.threefry_fold_in,
        )
        jax.config.values["jax_threefry_partitionable"]  # noqa: B018 (read by random_bits)
    except (ImportError, AttributeError, KeyError):
        return None
    if hash_unrolled is None:
        return None

    def unrolled_bits(key: Any, bit_width: int, shape: tuple[int, ...]) -> Any:
        # jax's `_threefry_random_bits_partitionable`, with the unrolled hash.
        count1, count2 = counts(shape)
        bits1, bits2 = hash_unrolled(key[0], key[1], count1, count2, use_rolled_loops=False)
        dtype = uint_dtypes[bit_width]
        if bit_width == 64:
            high = lax.convert_element_type(bits1, dtype)
            low = lax.convert_element_type(bits2, dtype)
            return lax.shift_left(high, lax.full((), 32, dtype)) | low
        return lax.convert_element_type(bits1 ^ bits2, dtype)

    def random_bits(key: Any, bit_width: int, shape: tuple[int, ...]) -> Any:
        if not jax.config.values["jax_threefry_partitionable"]:
            return rolled_bits(key, bit_width, shape)  # jax's other layout: jax's own
        return lax.platform_dependent(
            key,
            cpu=lambda key: unrolled_bits(key, bit_width, shape),
            default=lambda key: rolled_bits(key, bit_width, shape),
        )

    from jax.extend.random import define_prng_impl

    return define_prng_impl(
        key_shape=(2,),
        seed=seed,
        split=split,
        random_bits=random_bits,
        fold_in=fold_in,  # type: ignore[arg-type]  # jax's own threefry fold_in
        name="threefry2x32_unrolled",
        tag=UNROLLED_THREEFRY,
    )


@functools.cache
def _unrolled_hash() -> Any:
    """jax's threefry hash as its unrolled lowering, a function of traced arrays (private, item
    6), or None where it moved."""
    try:
        from jax._src.random import threefry2x32 as threefry

        return threefry._threefry2x32_lowering
    except (ImportError, AttributeError):
        return None


def splits_key_at() -> bool:
    """Whether `split_key_at` gives jax's split keys here: jax splits a threefry key as one
    hash per counter (`jax_threefry_partitionable`, jax's default), and what the hash is built
    from is where item 6 finds it. Otherwise use `jax.random.split`."""
    import jax

    return _unrolled_hash() is not None and bool(
        jax.config.values.get("jax_threefry_partitionable")
    )


def split_key_at(key_data: Any, index: Any) -> Any:
    """Key `index` of `jax.random.split(key, n)` (any `n > index`, below 2**32), as its data:
    the hash of the counter `(0, index)`, unrolled, where jax's split hashes every counter of
    `iota(n)` at once. Only where `splits_key_at()`.

    Args:
        key_data: a threefry key's data, uint32 of shape (2,).
        index: the key's index, a uint32 scalar (traced or not).
    """
    import jax.numpy as jnp

    hash_unrolled = _unrolled_hash()
    index = jnp.asarray(index, jnp.uint32)
    bits1, bits2 = hash_unrolled(
        key_data[0], key_data[1], jnp.zeros_like(index), index, use_rolled_loops=False
    )
    return jnp.stack([bits1, bits2])


# 7. jax 0.12.1 turns `jax_use_simplified_jaxpr_constants` on by default (off on jax 0.10.2 and
#    0.12.0): a closed-over constant over `jax_embedded_constants_max_bytes` (1 KiB) is passed
#    to the compiled program as an argument (`const_args`), no longer written into its lowered
#    text, and `serialize_executable` stores it with the machine code. The on-disk store names
#    a program by that text (`_executable_store`): on jax 0.12.1 a model whose `pm.Data` took
#    new values of the same shapes loaded the old values' executable, and ran with the old
#    values. The executor lowers every program with the flag off, its constants in its text,
#    as on the jax versions before; where a jax has no such flag, `const_args` finds what a
#    program holds apart, and the store neither saves nor moves such a program.


def constants_in_program() -> contextlib.AbstractContextManager:
    """Within it, jax writes the constants of what it traces and lowers into the program's
    text, as jax 0.10.2 and 0.12.0 do by default (item 7); a no-op where jax lacks the flag."""
    try:
        from jax._src import config

        return config.use_simplified_jaxpr_constants(False)
    except (ImportError, AttributeError):
        return contextlib.nullcontext()


def const_args(compiled: Any) -> list:
    """The constants that `compiled` (a `jax.stages.Compiled`) is passed beside its
    arguments, apart from its machine code (item 7); empty where jax keeps none apart."""
    return list(getattr(getattr(compiled, "_params", None), "const_args", None) or [])


# 8. What `jax.experimental.serialize_executable.serialize` pickles, read back by
#    `_executable_store.relocate` (which loads it onto another device, as no public API does):
#    `(unloaded, args_info, no_kwargs)` on jax 0.10.2 and 0.12.0; on jax 0.12.1 (its version
#    3) `(3, unloaded, args_info, no_kwargs, const_args)`. Another version raises.

#: The versions of `serialize_executable`'s tuple that `serialized_parts` reads.
SERIALIZED_VERSIONS = (3,)


def serialized_parts(loaded: Any) -> tuple[Any, list, bool, list]:
    """(unloaded executable, flat args info, no_kwargs, const_args) of what
    `serialize_executable.serialize` pickled, unpickled (item 8)."""
    if isinstance(loaded, tuple) and len(loaded) == 3:
        unloaded, args_info, no_kwargs = loaded
        return unloaded, args_info, no_kwargs, []
    if isinstance(loaded, tuple) and len(loaded) == 5 and loaded[0] in SERIALIZED_VERSIONS:
        _, unloaded, args_info, no_kwargs, constants = loaded
        return unloaded, args_info, no_kwargs, list(constants)
    raise ValueError("an executable serialized in a layout this package does not read")


def special_conversions() -> dict[type, Any]:
    """pytensor 3's JAX conversions of the scalar ops that pytensor 2 converts only through
    tensorflow-probability, as `{op class: conversion}`: `Erfcx` is jax's `erfcx`, `Erfcinv`
    `-ndtri(x / 2) / sqrt(2)` (pytensor 3's own). For pytensor 2 alone; empty on 3."""
    import jax
    import pytensor
    from pytensor.scalar import math as scalar_math

    if _release(pytensor.__version__) >= (3, 0):
        return {}

    def erfcx(op: Any, **kwargs: Any) -> Any:
        return jax.scipy.special.erfcx

    def erfcinv(op: Any, **kwargs: Any) -> Any:
        def erfcinv(x: Any) -> Any:
            return -jax.scipy.special.ndtri(x / 2) / jax.numpy.sqrt(2)

        return erfcinv

    # pytensor's scalar ops, made at its import (untyped): their classes.
    ops = {"erfcx": erfcx, "erfcinv": erfcinv}
    return {type(getattr(scalar_math, name)): conversion for name, conversion in ops.items()}
