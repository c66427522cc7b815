"""gRPC servicers, proto <-> domain conversion and interceptors."""
