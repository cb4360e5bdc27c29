"""What an operator watches: Prometheus metrics, their HTTP endpoint, and how long the
event loop is held."""
