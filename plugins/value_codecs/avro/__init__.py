"""The ``avro`` value codec: Avro binary values compiled per schema into a program
(:mod:`.ops`, :mod:`.program`) that numba kernels interpret to decode (:mod:`.decode_kernel`)
and encode (:mod:`.encode_kernel`)."""
