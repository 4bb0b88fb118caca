"""One upstream, one state, whatever era its clients speak: two clients written with the
official Python SDK, one of the handshake era (`mode="legacy"`) and one of 2026-07-28
(the SDK's default), take turns using plexus's `dual` upstream
(tests/python/dual_era_server.py) and must find one counter, one process, and every
change to its tool list in both their lists and in the pin check.

    target/python-venv/bin/python tests/python/one_state_client.py \
        --url http://127.0.0.1:PORT/mcp --plexus target/debug/plexus --config CONFIG

The upstream runs with `on_schema_change = "block"`. Prints one line per check
(`ok <name> <detail>`) and exits 1 with `FAIL <name>: <why>` at the first failure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from typing import Any, Awaitable, TypeVar

import anyio
import mcp_types as types
from mcp import Client
from mcp.client import ClientRequestContext
from mcp.shared.exceptions import MCPError

warnings.simplefilter("ignore")

CALL_TIMEOUT_S = 30.0
SEEN_WITHIN_S = 15.0
TOTAL_S = 240.0
QUARANTINED = -33006

T = TypeVar("T")


class CheckFailed(Exception):
    pass


def ok(name: str, detail: str) -> None:
    print(f"ok {name} {detail}", flush=True)


def ensure(condition: bool, name: str, why: str) -> None:
    if not condition:
        raise CheckFailed(f"{name}: {why}")


async def bounded(name: str, awaitable: Awaitable[T]) -> T:
    try:
        with anyio.fail_after(CALL_TIMEOUT_S):
            return await awaitable
    except TimeoutError:
        raise CheckFailed(f"{name}: no answer within {CALL_TIMEOUT_S:.0f} s") from None


class Plexus:
    """The `plexus` command on the daemon's config."""

    def __init__(self, binary: str, config: str) -> None:
        self.binary, self.config = binary, config

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [self.binary, *args, "--config", self.config], capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise CheckFailed(f"plexus {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def pid(self) -> int:
        status = json.loads(self.run("status", "--json"))
        dual = [u for u in status["upstreams"] if u["name"] == "dual"]
        ensure(len(dual) == 1 and isinstance(dual[0]["pid"], int), "status", f"no pid for dual: {status}")
        ensure("handshake_twin" not in dual[0], "status", f"a second process: {dual[0]}")
        return dual[0]["pid"]

    def pending(self) -> Any:
        return json.loads(self.run("pins", "diff", "dual", "--json"))


async def text_of(client: Client, name: str, arguments: dict[str, Any], check: str) -> str:
    try:
        result = await bounded(check, client.call_tool(name, arguments))
    except MCPError as error:
        raise CheckFailed(f"{check}: error {error.code}: {error.message} {error.data!r}") from None
    ensure(not result.is_error, check, f"tool error: {result}")
    first = result.content[0]
    ensure(isinstance(first, types.TextContent), check, f"no text: {result}")
    return first.text


async def refused(client: Client, name: str, arguments: dict[str, Any], check: str) -> MCPError:
    try:
        result = await bounded(check, client.call_tool(name, arguments))
    except MCPError as error:
        return error
    raise CheckFailed(f"{check}: {name} was answered: {result}")


async def tool_names(client: Client) -> set[str]:
    names: set[str] = set()
    cursor = None
    while True:
        page = await bounded("list", client.list_tools(cursor=cursor))
        names.update(tool.name for tool in page.tools)
        cursor = page.next_cursor
        if not cursor:
            return names


async def until_listed(clients: dict[str, Client], name: str, present: bool, check: str) -> None:
    deadline = time.monotonic() + SEEN_WITHIN_S
    for era, client in clients.items():
        while (name in await tool_names(client)) != present:
            ensure(time.monotonic() < deadline, check, f"{era} client: {name} listed is not {present}")
            await anyio.sleep(0.1)


async def until_held(clients: dict[str, Client], name: str, arguments: dict[str, Any], check: str) -> None:
    """Every client's call of `name` is refused as quarantined, soon."""
    deadline = time.monotonic() + SEEN_WITHIN_S
    for era, client in clients.items():
        while True:
            try:
                await bounded(check, client.call_tool(name, arguments))
            except MCPError as error:
                if error.code == QUARANTINED:
                    ensure(error.data["upstream"] == "dual", check, f"{error.data}")
                    break
            ensure(time.monotonic() < deadline, check, f"{era} client: {name} never held")
            await anyio.sleep(0.1)


def signer(era: str):
    """An elicitation callback that signs as `era`."""

    async def elicitation(_context: ClientRequestContext, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"name": era})

    return elicitation


async def run(url: str, plexus: Plexus, upstream_era: str) -> None:
    old = Client(url, mode="legacy", cache=None, elicitation_callback=signer("old"))
    new = Client(url, cache=None, elicitation_callback=signer("new"))
    async with old, new:
        ensure(old.protocol_version != "2026-07-28", "eras", f"legacy client speaks {old.protocol_version}")
        ensure(new.protocol_version == "2026-07-28", "eras", f"new client speaks {new.protocol_version}")
        clients = {"handshake": old, "2026-07-28": new}
        ok("eras", f"{old.protocol_version} and {new.protocol_version}")
        first_pid = plexus.pid()

        # One counter: turns alternate between the eras and the values run on.
        pids = set()
        for turn in range(8):
            era, client = list(clients.items())[turn % 2]
            value, pid = (await text_of(client, "dual__count", {}, f"count-{turn}")).split()
            ensure(int(value) == turn + 1, "one-counter", f"turn {turn} ({era}) saw {value}")
            pids.add(int(pid))
        ensure(pids == {first_pid}, "one-process", f"counted by {pids}, status shows {first_pid}")
        ok("one-counter", f"8 turns, values 1..8, process {first_pid}")

        # A tool that asks its client with a request of its own: in the handshake era
        # each client is asked (relayed, or bridged as an input-required round); on a
        # 2026-07-28 connection the server itself has no back-channel for it.
        for era, client in clients.items():
            name = "old" if era == "handshake" else "new"
            if upstream_era == "handshake":
                signed = await text_of(client, "dual__sign", {}, f"sign-{era}")
                ensure(signed == f"signed by {name}", "sign", f"{era}: {signed}")
            else:
                try:
                    result = await bounded(f"sign-{era}", client.call_tool("dual__sign", {}))
                    failed = result.is_error
                except MCPError:
                    failed = True
                ensure(failed, "sign", f"{era}: answered on a 2026-07-28 connection")
        ok("sign", f"upstream in the {upstream_era} era: each client {'asked' if upstream_era == 'handshake' else 'refused by the server'}")

        # A tool added through either era: the pin check sees it first (held as a
        # new entry under "block"), then both clients list and call it once approved.
        for era, client in clients.items():
            added = f"from_{era.replace('-', '_')}"
            exposed = f"dual__{added}"
            await text_of(client, "dual__add_tool", {"name": added}, f"add-{era}")
            await until_held(clients, exposed, {}, f"held-{added}")
            diff = json.dumps(plexus.pending())
            ensure(added in diff, f"pending-{added}", diff[:500])
            plexus.run("pins", "approve", "dual")
            await until_listed(clients, exposed, True, f"listed-{added}")
            for other_era, other in clients.items():
                answer = await text_of(other, exposed, {}, f"call-{added}-{other_era}")
                ensure(answer == added, f"call-{added}", answer)
            ok("added", f"{exposed} (added by the {era} client): held, pending, approved, listed and called by both")

        # A breaking change made through either era is held for both clients.
        for step, (era, client) in enumerate(clients.items()):
            arguments = {"step": 1} if step == 0 else {"step": 1, "times": 1}
            await text_of(client, "dual__break_count", {}, f"break-{era}")
            await until_held(clients, "dual__count", arguments, f"held-count-{era}")
            ok("held", f"a breaking change to dual__count made by the {era} client is held for both")
            plexus.run("pins", "approve", "dual")
            # Approved, the new schema serves both, on the same counter.
            for other_era, other in clients.items():
                deadline = time.monotonic() + SEEN_WITHIN_S
                while True:
                    try:
                        answer = await text_of(other, "dual__count", arguments, f"count-after-{era}")
                        break
                    except CheckFailed:
                        ensure(time.monotonic() < deadline, "approved", f"{other_era}: count still refused")
                        await anyio.sleep(0.1)
                ensure(int(answer.split()[1]) == first_pid, "one-process", answer)
        ensure(plexus.pid() == first_pid, "one-process", f"status pid moved from {first_pid}")
        ok("one-process", f"{first_pid} from the first call to the last")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--plexus", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--upstream-era", choices=["handshake", "2026-07-28"], required=True)
    args = parser.parse_args()
    async def bounded_run() -> None:
        with anyio.fail_after(TOTAL_S):
            await run(args.url, Plexus(args.plexus, args.config), args.upstream_era)

    try:
        anyio.run(bounded_run)
    except CheckFailed as failed:
        print(f"FAIL {failed}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
