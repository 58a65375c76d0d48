"""LLVM intrinsics that numba does not expose, for the kernels of the fast engine (:mod:`hlbl.kernels`).

- :func:`prefetch_intrinsic` builds a cache-line prefetch (``llvm.prefetch``); :data:`prefetch` is
  the one the engine uses (a read into L2) and :func:`prefetch_row` prefetches a whole row.
- :func:`claim` is an atomic compare-and-swap (``cmpxchg``) on one array element.
- :func:`cycles` reads the CPU's cycle counter (``llvm.readcyclecounter``).

Each is a numba ``@intrinsic`` and can only be called from ``@njit`` code.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


def _element_pointer(context, builder, aryty, ary, inds):
    """LLVM pointer to ``ary[inds]`` (no bounds check; ``inds`` are intp LLVM values, one per dim)."""
    return cgutils.get_item_pointer2(
        context,
        builder,
        data=ary.data,
        shape=cgutils.unpack_tuple(builder, ary.shape),
        strides=cgutils.unpack_tuple(builder, ary.strides),
        layout=aryty.layout,
        inds=inds,
    )


def prefetch_intrinsic(write: bool, locality: int):
    """A numba intrinsic ``f(arr, row, off)`` hinting the CPU to fetch the cache line at byte ``off``
    of ``arr[row]`` (any ndim >= 1): LLVM's ``llvm.prefetch`` (opaque-pointer name, as in the LLVM
    of the numba this package supports). ``locality`` 3..0 is prefetcht0 (into L1), t1 (L2), t2,
    nta on x86; ``write`` asks for the line in writable state (prefetchw, whatever the locality)."""

    @intrinsic
    def _prefetch(typingctx, arr, row, off):
        sig = types.void(arr, row, off)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            zero = context.get_constant(types.intp, 0)
            row = context.cast(builder, args[1], signature.args[1], types.intp)
            off = context.cast(builder, args[2], signature.args[2], types.intp)
            ptr = _element_pointer(context, builder, aryty, ary, [row] + [zero] * (aryty.ndim - 1))
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0"
            )
            addr = builder.gep(builder.bitcast(ptr, i8p), [off])
            builder.call(fn, [addr, ir.Constant(i32, int(write)), ir.Constant(i32, locality), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return sig, codegen

    return _prefetch


# Every prefetch of the engine is a read into L2 (prefetcht1). Without prefetches a loop over
# random rows of a big table waits for memory row after row. Why L2 and not L1 or a write
# prefetch (prefetcht0, prefetchw): those hold one of the core's few L1 miss buffers until the
# line arrives, which caps how many cold rows a loop can have in flight; the L2 tracks more
# misses. bench/memfloor.py measures the two kinds of prefetch side by side (docs/engine.md).
prefetch = prefetch_intrinsic(write=False, locality=2)

CACHE_LINE = 64  # bytes


@njit(inline="always", cache=True)
def prefetch_row(W, j):
    """Prefetch row j of a float32 (., d) array, every cache line of it."""
    for off in range(0, W.shape[1] * 4, CACHE_LINE):
        prefetch(W, j, off)


@intrinsic
def claim(typingctx, arr, idx, seen, new):
    """Atomically set ``arr[idx]`` to ``new`` if it still holds ``seen``; True if it did (LLVM's
    ``cmpxchg``, which numba does not expose). Hogwild threads claim a row's step stamp with it,
    so that only one of them applies the steps the row skipped."""
    sig = types.boolean(arr, idx, seen, new)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = _element_pointer(context, builder, aryty, ary, [i])
        old = context.cast(builder, args[2], signature.args[2], aryty.dtype)
        val = context.cast(builder, args[3], signature.args[3], aryty.dtype)
        return builder.extract_value(builder.cmpxchg(ptr, old, val, "monotonic"), 1)

    return sig, codegen


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (LLVM's ``readcyclecounter``: rdtsc on x86; 0 where there is none),
    for the per-phase profile of a step (``kernels._step``'s ``clock``; ``bench/phases.py``)."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=ir.FunctionType(ir.IntType(64), []))
        return builder.call(fn, [])

    return sig, codegen
