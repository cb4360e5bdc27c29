"""The partition log: record batch format, segments with indexes, recovery and retention.

Pure modules: ``batch`` (format), ``index`` (index math), ``retention`` (deletion
decisions). Drivers: ``segment`` (files), ``file_log`` (a partition on disk),
``memory_log`` (the same interface in memory, for tests and simulation).
"""
