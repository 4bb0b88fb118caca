"""plexus connect, driven by the official Python SDK: the script launches
`plexus connect URL` as its stdio server, calls a tool, says `ready` and waits for a
line on its stdin (the test kills and restarts the daemon meanwhile), then calls
again until the bridge has reconnected, and says `ok` or why not.

usage: connect_client.py --mode auto|legacy -- PROGRAM ARGS...
"""

import argparse
import os
import sys
import time
import warnings

import anyio
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

warnings.simplefilter("ignore")


def text_of(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def echo(client: Client, text: str) -> str:
    with anyio.fail_after(30):
        return text_of(await client.call_tool("fx__echo", {"text": text}))


async def run(server: StdioServerParameters, mode: str) -> None:
    async with Client(server, mode=mode, cache=None) as client:
        first = await echo(client, "before")
        if first != "before":
            raise SystemExit(f"fail: the first call answered {first!r}")
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        deadline = time.monotonic() + 30
        while True:
            try:
                text = await echo(client, "after")
                if text == "after":
                    break
                problem = f"answered {text!r}"
            except (MCPError, TimeoutError) as error:
                problem = repr(error)
            if time.monotonic() > deadline:
                raise SystemExit(f"fail: no call succeeded after the restart: {problem}")
            await anyio.sleep(0.2)
        print(f"ok {mode} protocol {client.protocol_version}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["auto", "legacy"], default="auto")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    env = dict(os.environ)
    env.setdefault("PLEXUS_LOG", "warn")
    anyio.run(run, StdioServerParameters(command=command[0], args=command[1:], env=env), args.mode)


if __name__ == "__main__":
    main()
