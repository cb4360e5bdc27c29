"""The partition log: record batch format, segments with indexes, recovery and retention.

Pure modules: ``batch`` (format), ``index`` (index math), ``retention`` (deletion
decisions). Drivers: ``segment`` (files), ``file_log`` (a partition on disk), which
opens its directory with ``log_loader``, keeps producer snapshots with
``producer_snapshots`` and swaps in the cleaner's output with ``segment_swap``
(``checkpoint_files``: atomic small files and checked offsets); ``memory_log`` (the same
interface in memory, for tests and simulation).
"""
