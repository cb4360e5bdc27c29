"""``python -m headwater.tools.chaos``: see headwater.tools.chaos.runner and docs/chaos.md."""

import headwater  # noqa: F401  (before grpc: it turns gRPC fork support off)
from headwater.tools.chaos.runner import main

if __name__ == "__main__":
    main()
