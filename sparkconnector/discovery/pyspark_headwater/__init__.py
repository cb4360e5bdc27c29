"""Installed as the top-level module ``pyspark_headwater``: pyspark registers the
``DefaultSource`` of every ``pyspark_*`` module it finds, so ``format("headwater")``
works without a ``register`` call."""

from headwater.sparkconnector.datasource import HeadwaterDataSource as DefaultSource

__all__ = ["DefaultSource"]
