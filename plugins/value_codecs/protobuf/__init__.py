"""The ``protobuf`` value codec: upb's deterministic wire form read and written by numba kernels
(:mod:`.decode_kernel`, :mod:`.encode_kernel`); other rows through the upb runtime."""
