"""The service layer: one function per use case (schedule a pool, recompute a pool, explain),
orchestrating the store and the pure domain inside the caller's transaction.

`api/` (the gRPC servicers), `jobs/` (the periodic jobs), the CLI and the benchmarks call these;
none of them reaches past a service into another caller. SQL lives only in `store/`, rules only
in `domain/`: a service reads a snapshot through the store, hands it to the domain and writes the
result back through the store, and says in its docstring which locks it takes.
"""
