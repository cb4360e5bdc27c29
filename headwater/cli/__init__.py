"""The ``headwater`` command line.

``main`` builds the root group (its client settings and error reporting) and names each
command's module, loaded only when that command is called (``lazy``). Each command, with
its subcommands and helpers, is in a module of its own: ``serve``, ``dev_cluster``,
``tls``, ``topics``, ``produce``, ``consume``, ``groups``, ``cluster``, ``debug``, and
``access`` (``acls``, ``users``, ``quotas``); ``bench`` is ``headwater.tools.benchmarks``'.
The options several commands take are defined once in ``options``; the client settings
are layered in ``security``; tables, lines and one-line errors are printed by ``output``.
"""
