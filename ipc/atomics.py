"""Memory ordering for shared-memory kernels: the only module of nsqpy that emits atomic instructions.

Theory of operation
-------------------
numba has no public CPU atomics, and a plain load inside a spin loop is hoisted out of the loop by LLVM (the loop
then never sees the other process's store). Each function here is a ``numba.extending.intrinsic`` that emits one
LLVM instruction on element ``i`` of a 1-D integer numpy array (the array may be a view of shared memory):

    load_acquire(arr, i)          load atomic ... acquire        -> value
    store_release(arr, i, v)      store atomic ... release
    cas(arr, i, expected, new)    cmpxchg ... seq_cst seq_cst    -> the old value (success iff old == expected)
    fetch_add(arr, i, delta)      atomicrmw add ... seq_cst      -> the old value
    fence()                       fence seq_cst (orders an earlier store before a later load: Dekker, wake-ups)
    cpu_pause()                   x86 `pause` in a spin loop (nothing elsewhere)
    copy_bytes(dst, d, src, s, n) llvm.memcpy of n bytes between uint8 arrays (not ordered; numba's slice copy is
                                  ~20x slower, and every layout module needs a raw copy)
    get_word(buf, off)            plain int64 load / store at an 8-aligned byte offset of a uint8 array (record
    put_word(buf, off, v)         headers: ``arr.view(np.int64)`` inside a kernel costs a refcount round trip)

The functions are callable only from @njit code; the Python-level wrappers at the bottom (``py_*``) exist for
tests and for cold paths such as initialising a layout.

Memory model
------------
Written for the C++11/LLVM model, so it is correct on any CPU LLVM targets as long as every cross-process handoff
is "write the data with plain stores, then store_release the word that publishes it; the other side
load_acquires that word, then reads the data". Tested on x86-64 (TSO: acquire/release compile to plain moves,
only the seq_cst fence and the locked read-modify-writes cost anything). On aarch64 the same code compiles to
ldar/stlr and dmb, so it stays correct there; nothing relies on TSO.

Element width: the array's own integer dtype (int64 and uint64 are the contract; int32/uint32 also work).
Elements must be naturally aligned, which numpy views at 8-aligned offsets always are. No bounds check is made:
the thin Python classes validate layouts on attach, kernels only index inside them.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from nsqpy.ipc.numba_cache import JIT, warm_up_step

__all__ = [
    "load_acquire", "store_release", "cas", "fetch_add", "fence", "cpu_pause", "copy_bytes", "get_word", "put_word",
    "py_load_acquire", "py_store_release", "py_cas", "py_fetch_add",
]

_IS_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _is_int_array(arr) -> bool:
    return isinstance(arr, types.Array) and arr.ndim == 1 and isinstance(arr.dtype, types.Integer)


def _element_pointer(context, builder, arrty, arr, index_ty, index):
    """Pointer to arr[index], with the index converted to intp (no wraparound, no bounds check)."""
    ary = context.make_array(arrty)(context, builder, arr)
    idx = context.cast(builder, index, index_ty, types.intp)
    return cgutils.get_item_pointer(context, builder, arrty, ary, [idx], wraparound=False)


def _value(context, builder, arrty, value_ty, value):
    return context.cast(builder, value, value_ty, arrty.dtype)


@intrinsic
def load_acquire(typingctx, arr, i):
    if not (_is_int_array(arr) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, arr, args[0], i, args[1])
        llty = context.get_value_type(arr.dtype)
        return builder.load_atomic(ptr, "acquire", arr.dtype.bitwidth // 8, typ=llty)

    return arr.dtype(arr, i), codegen


@intrinsic
def store_release(typingctx, arr, i, v):
    if not (_is_int_array(arr) and isinstance(i, types.Integer) and isinstance(v, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, arr, args[0], i, args[1])
        builder.store_atomic(_value(context, builder, arr, v, args[2]), ptr, "release", arr.dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.void(arr, i, v), codegen


@intrinsic
def cas(typingctx, arr, i, expected, new):
    if not (_is_int_array(arr) and isinstance(i, types.Integer)
            and isinstance(expected, types.Integer) and isinstance(new, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, arr, args[0], i, args[1])
        exp = _value(context, builder, arr, expected, args[2])
        val = _value(context, builder, arr, new, args[3])
        pair = builder.cmpxchg(ptr, exp, val, "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)

    return arr.dtype(arr, i, expected, new), codegen


@intrinsic
def fetch_add(typingctx, arr, i, delta):
    if not (_is_int_array(arr) and isinstance(i, types.Integer) and isinstance(delta, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, arr, args[0], i, args[1])
        return builder.atomic_rmw("add", ptr, _value(context, builder, arr, delta, args[2]), "seq_cst")

    return arr.dtype(arr, i, delta), codegen


@intrinsic
def fence(typingctx):
    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def cpu_pause(typingctx):
    def codegen(context, builder, sig, args):
        if _IS_X86:
            # the SSE2 intrinsic, not inline asm: numba's LLVM has no asm parser initialised
            pause = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                   "llvm.x86.sse2.pause")
            builder.call(pause, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def copy_bytes(typingctx, dst, dst_off, src, src_off, n):
    """dst[dst_off:dst_off+n] = src[src_off:src_off+n] for uint8 arrays, as one llvm.memcpy (regions must not
    overlap; no bounds check)."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)
            and dst.dtype == types.uint8 and src.dtype == types.uint8):
        return None

    def codegen(context, builder, sig, args):
        dptr = _element_pointer(context, builder, dst, args[0], dst_off, args[1])
        sptr = _element_pointer(context, builder, src, args[2], src_off, args[3])
        count = context.cast(builder, args[4], n, types.intp)
        cgutils.raw_memcpy(builder, dptr, sptr, count, 1)
        return context.get_dummy_value()

    return types.void(dst, dst_off, src, src_off, n), codegen


def _word_pointer(context, builder, arrty, arr, index_ty, index):
    ptr = _element_pointer(context, builder, arrty, arr, index_ty, index)
    return builder.bitcast(ptr, ir.IntType(64).as_pointer())


@intrinsic
def get_word(typingctx, buf, byte_off):
    """The int64 at byte ``byte_off`` (8-aligned) of a uint8 array; a plain load: not ordered."""
    if not (isinstance(buf, types.Array) and buf.dtype == types.uint8 and isinstance(byte_off, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _word_pointer(context, builder, buf, args[0], byte_off, args[1])
        return builder.load(ptr, align=8, typ=ir.IntType(64))

    return types.int64(buf, byte_off), codegen


@intrinsic
def put_word(typingctx, buf, byte_off, value):
    """Store an int64 at byte ``byte_off`` (8-aligned) of a uint8 array; a plain store: not ordered."""
    if not (isinstance(buf, types.Array) and buf.dtype == types.uint8 and isinstance(byte_off, types.Integer)
            and isinstance(value, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _word_pointer(context, builder, buf, args[0], byte_off, args[1])
        builder.store(context.cast(builder, args[2], value, types.int64), ptr, align=8)
        return context.get_dummy_value()

    return types.void(buf, byte_off, value), codegen


# Python-callable wrappers for tests and cold paths (a kernel call costs ~0.2 us: never use these per record).
@njit(nogil=True, **JIT)
def py_load_acquire(arr, i):
    return load_acquire(arr, i)


@njit(nogil=True, **JIT)
def py_store_release(arr, i, v):
    store_release(arr, i, v)


@njit(nogil=True, **JIT)
def py_cas(arr, i, expected, new):
    return cas(arr, i, expected, new)


@njit(nogil=True, **JIT)
def py_fetch_add(arr, i, delta):
    return fetch_add(arr, i, delta)


@warm_up_step
def warm_up():
    """The Python-callable atomics the broker uses: the control block's counters (workers/control/block.py)."""
    import numpy as np
    py_fetch_add(np.zeros(1, np.int64), 0, 1)
