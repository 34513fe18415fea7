"""The development stack and the quickstart, as a plugin of ``bergstream``.

``bergstream.devstack.stack`` runs real Kafka (KRaft), an S3 server and Redis on this machine,
started and stopped by PID; ``bergstream.devstack.quickstart`` is the end-to-end demo on top of it.
``bergstream.devstack.plugin`` adds the ``stack`` and ``quickstart`` commands through the
``register_commands`` hook, as the pipeline adds its own. Core imports nothing of this package.
"""
