"""The ``headwater`` command line: ``main`` (the root group and the commands it defines
itself), one module per command group (``access``, ``cluster``, ``consume``, ``groups``,
``produce``, ``security``), plain tables and lines (``output``) and commands loaded only
when called (``lazy``)."""
