"""What the value codecs share: column arenas (:mod:`.arena_layout`, :mod:`.arena_kernel`,
:mod:`.arena_columns`, :mod:`.arena_assembly`), the numba helpers every kernel inlines
(:mod:`.kernel_read`, :mod:`.kernel_write`, :mod:`.decimal128`), the slot tree of a compiled
program (:mod:`.slot`), Arrow arrays flattened back into columns for the encoders
(:mod:`.flatten`) and the per-codec cache of parsed and compiled schemas (:mod:`.schema_cache`).
"""
