"""Built-in cache backends for the files ISK synthesizes (see docs/architecture.md, "ISK").

:mod:`.local_disk` (``local``: verified, size-bounded, atomic files on local disk),
:mod:`.s3_cache` (``s3``: objects in a bucket of any S3-compatible server, shared by gateway
replicas), :mod:`.redis_cache` (``redis``: metadata and small files in Redis), :mod:`.entries`
(the stored form of a network cache's entry, verified on read) and :mod:`.plugin` (their
registrations and config models).
"""
