"""The ``json`` value codec: plain JSON objects (no registry) grouped into shapes declared as
JSON Schemas and read by the ``json-schema`` machinery."""
