"""The physical reference of `bench_serving.py`: a gRPC Python server that answers Ledger's
GetFairShare with fixed bytes and does nothing else (no database, no interceptors).

    python bench/trivial_server.py --address 127.0.0.1:PORT --reply FILE [--processes N]

With `--processes N`, N such servers share the port (SO_REUSEPORT), as `gpufair serve` does."""

from __future__ import annotations

import argparse
import multiprocessing
import signal
import threading
from concurrent import futures
from pathlib import Path

import grpc

METHOD = "/gpufair.v1.Ledger/GetFairShare"


def serve(address: str, reply: bytes, threads: int) -> None:
    def answer(_request: bytes, _context: grpc.ServicerContext) -> bytes:
        return reply

    handler = grpc.method_handlers_generic_handler(
        "gpufair.v1.Ledger",
        {"GetFairShare": grpc.unary_unary_rpc_method_handler(answer)},
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads),
        handlers=[handler],
        options=[("grpc.so_reuseport", 1)],
    )
    server.add_insecure_port(address)
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    server.stop(1.0).wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--reply", required=True, help="file with the serialized reply")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--threads", type=int, default=32)
    args = parser.parse_args()
    reply = Path(args.reply).read_bytes()
    if args.processes == 1:
        serve(args.address, reply, args.threads)
        return
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=serve, args=(args.address, reply, args.threads))
        for _ in range(args.processes)
    ]
    for w in workers:
        w.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    for w in workers:
        w.terminate()
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
