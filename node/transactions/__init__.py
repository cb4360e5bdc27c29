"""Transactions: the transaction coordinator's state and decisions (pure)."""
