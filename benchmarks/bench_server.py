"""`reinforge serve` under concurrent load from a bounded loopback client.

    python benchmarks/bench_server.py [--requests 128] [--concurrency 1,4,16] [--max-tokens 8]

The server (shipped tiny-base) runs in this process on a uvicorn thread; the client keeps at
most ``concurrency`` chat-completion requests in flight (asyncio + httpx) and records each
request's latency. Reports requests/s, generated tokens/s and p50/p99 latency per concurrency,
and how many engine batches served them (concurrent requests share a batch).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import threading
import time

import httpx
import torch
import uvicorn

from reinforge.serve.launch import build_server_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def load(url: str, n: int, concurrency: int, max_tokens: int) -> tuple[list[float], int, float]:
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    tokens = 0

    async with httpx.AsyncClient(timeout=120) as client:
        async def one(i: int) -> None:
            nonlocal tokens
            body = {"model": "tiny-base", "messages": [{"role": "user", "content": f"{i % 90 + 10}+{i % 7 + 3}="}],
                    "max_tokens": max_tokens, "temperature": 1.0}
            async with sem:
                t0 = time.perf_counter()
                r = await client.post(f"{url}/v1/chat/completions", json=body)
                latencies.append(time.perf_counter() - t0)
            r.raise_for_status()
            tokens += r.json()["usage"]["completion_tokens"]

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return latencies, tokens, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--max-tokens", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(2)
    app = build_server_app("tiny-base")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    asyncio.run(load(url, 8, 4, args.max_tokens))  # warm-up
    worker = app.state.server.worker
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.requests} chat requests, "
          f"max_tokens {args.max_tokens}, temperature 1\n")
    print("| concurrency | requests/s | generated tok/s | p50 latency ms | p99 latency ms | engine batches |")
    print("|---|---|---|---|---|---|")
    for c in (int(x) for x in args.concurrency.split(",")):
        before = worker.batches_run
        lat, tokens, wall = asyncio.run(load(url, args.requests, c, args.max_tokens))
        lat.sort()
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        print(f"| {c} | {args.requests / wall:.1f} | {tokens / wall:,.0f} | {statistics.median(lat) * 1e3:.1f} | "
              f"{p99 * 1e3:.1f} | {worker.batches_run - before} |")
    server.should_exit = True


if __name__ == "__main__":
    main()
