"""The gRPC front: the servicers of ``headwater.v1`` (Broker, Admin, Groups, Controller),
translations of requests and answers over the broker core, with forwarding to the node
that serves a request and the checks every call gets (decoding, hooks)."""
