"""How many SSE chunks per second can bench/serve.py's client read? A trivial server in its own
process (raw asyncio, pre-built chunked bodies, no engine) streams `--chunks` events to each of
`--streams` concurrent POSTs; the client under test reads them as bench/serve.py does.

  python bench/probes/sse_client_ceiling.py --client httpx aiohttp --streams 256 --chunks 128
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EVENT = (b'data: {"id":"cmpl-x","object":"text_completion","created":1,"model":"m","choices":'
         b'[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}],"usage":null}\n\n')
USAGE = b'data: {"id":"cmpl-x","choices":[],"usage":{"completion_tokens":%d}}\n\ndata: [DONE]\n\n'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, chunks: int) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    while True:
        try:
            request = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:  # the client closed its connection
            return
        length = next((int(line.split(b":")[1]) for line in request.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        await reader.readexactly(length)
        writer.write(head)
        for _ in range(chunks):  # one write and one yield per event, as a server streams tokens
            writer.write(_chunk(EVENT))
            await asyncio.sleep(0)
        writer.write(_chunk(USAGE % chunks) + b"0\r\n\r\n")
        await writer.drain()


def _serve(sock: socket.socket, chunks: int) -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _handle(r, w, chunks), sock=sock)
        await server.serve_forever()

    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


async def _run(client: str, url: str, streams: int) -> tuple[int, float]:
    import serve  # bench/serve.py: the client under test

    body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 1, "stream": True}
    async with serve.make_client(client, 600.0) as c:
        await c.send(url, body)  # warm-up (connection pool, imports)
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(c.send(url, body) for _ in range(streams)))
        dt = time.perf_counter() - t0
    assert all(o.ok for o in outs), [o.error for o in outs if not o.ok][:3]
    return sum(len(o.chunk_times) for o in outs), dt


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--client", nargs="+", default=["httpx", "aiohttp"])
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--chunks", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    proc = mp.get_context("fork").Process(target=_serve, args=(sock, a.chunks), daemon=True)
    proc.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        for _ in range(a.repeats):
            for client in a.client:
                n, dt = asyncio.run(_run(client, url, a.streams))
                print(f"{client}: {n} chunks in {dt:.2f}s = {n / dt:,.0f} chunks/s")
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
