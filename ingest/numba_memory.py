"""Reads and writes of arrays for our Numba kernels without the checks and counts Numba adds, for
code that has checked its positions itself: our JSON scanner (ingest/columnar_scan.py) and the
source rows' interleave (ingest/source_rows.py). Pure; how they were found: docs/development.md
("perf on Numba code").

- `NO_REFCOUNTS`: the options of a kernel that allocates nothing (`_nrt=False`, Numba's own flag).
  Every array handed to an inlined helper was counted up and down again with an atomic
  instruction, and those were 37 % of the scanner's time (perf: `lock incq` and `lock decq` in
  NRT_incref/NRT_decref): ~330 -> ~240 ns an event. So such a kernel's caller passes every array.
- `item`: array[at] without the compare and conditional move Numba's indexing adds for a negative
  index (~17 % of the scanner, whose every read is of a position it has checked: 173 -> 144 ns).
- `word` / `put_word`: 8 bytes read or written at once, unaligned, where the caller knows they are
  there (names compared, labels found and copied 8 bytes at a time).
- `first_flagged`: the lowest byte of a word whose high bit is set (`cttz`), for SWAR scans.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

NO_REFCOUNTS = {"nogil": True, "cache": True, "_nrt": False}

_WORD_POINTER = ir.IntType(64).as_pointer()


def _address(context, builder, signature, args):
    """In an intrinsic's code: a pointer to array[at], its first two arguments (a 1-d array)."""
    view = context.make_array(signature.args[0])(context, builder, args[0])
    return builder.gep(view.data, [args[1]])


@intrinsic
def item(typingctx, array, at):
    """array[at] for an `at` known to be in [0, len) of a 1-d array."""
    def codegen(context, builder, signature, args):
        return builder.load(_address(context, builder, signature, args))
    return array.dtype(array, at), codegen


@intrinsic
def word(typingctx, array, at):
    """The 8 bytes array[at:at + 8] as one little-endian uint64, read unaligned (the caller knows
    they are there)."""
    def codegen(context, builder, signature, args):
        return builder.load(builder.bitcast(_address(context, builder, signature, args), _WORD_POINTER), align=1)
    return types.uint64(array, at), codegen


@intrinsic
def put_word(typingctx, array, at, value):
    """array[at:at + 8] = the 8 bytes of `value` (little-endian), written unaligned (the caller
    knows there is room)."""
    def codegen(context, builder, signature, args):
        builder.store(args[2], builder.bitcast(_address(context, builder, signature, args), _WORD_POINTER), align=1)
        return context.get_dummy_value()
    return types.none(array, at, value), codegen


@intrinsic
def first_flagged(typingctx, flags):
    """The index of the lowest byte of `flags` (not 0) whose high bit is set, as an int64."""
    def codegen(context, builder, signature, args):
        return builder.lshr(builder.cttz(args[0], ir.Constant(ir.IntType(1), 0)), ir.Constant(ir.IntType(64), 3))
    return types.int64(types.uint64), codegen


__all__ = ["NO_REFCOUNTS", "first_flagged", "item", "put_word", "word"]
