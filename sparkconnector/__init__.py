"""Spark Structured Streaming source and sink for Headwater (``format("headwater")``).

Not built yet; the connector arrives with the Spark work.
"""
