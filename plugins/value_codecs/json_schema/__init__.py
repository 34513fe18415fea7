"""The ``json-schema`` value codec: JSON Schema values in their canonical text read and written
by numba kernels (:mod:`.decode_kernel`, :mod:`.encode_kernel`), other rows through orjson."""
