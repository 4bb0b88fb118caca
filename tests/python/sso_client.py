"""The official Python SDK's OAuth client logging in to plexus through its identity
provider (tests/tests/e2e/sso.rs): plexus answers 401 with resource_metadata, the
SDK discovers the provider, registers, and runs the authorization code flow with
PKCE. The "browser" here follows the provider's redirects with a cookie jar and
signs in on its login form as --login; the redirect to --redirect-uri is caught,
not served. Prints one JSON line: the tools listed and the access token the SDK
used (so the test can check that it appears nowhere it must not).

    sso_client.py --url http://127.0.0.1:PORT/mcp --login alice --redirect-uri URI
"""

from __future__ import annotations

import argparse
import json
from urllib.parse import parse_qs, urljoin, urlparse

import anyio
import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)


class MemoryStorage(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


async def run(url: str, login: str, redirect_uri: str) -> None:
    caught: dict[str, str | None] = {}

    async def browse(authorization_url: str) -> None:
        """Follows the provider's redirects as a browser would, posting the login form."""
        async with httpx2.AsyncClient(follow_redirects=False, timeout=30) as browser:
            response = await browser.get(authorization_url)
            for _ in range(20):
                if response.status_code in (302, 303):
                    location = urljoin(str(response.url), response.headers["location"])
                    if location.startswith(redirect_uri):
                        query = parse_qs(urlparse(location).query)
                        if "code" not in query:
                            raise SystemExit(f"fail: the provider redirected without a code: {location}")
                        caught["code"] = query["code"][0]
                        caught["state"] = query.get("state", [None])[0]
                        caught["iss"] = query.get("iss", [None])[0]
                        return
                    response = await browser.get(location)
                elif response.status_code == 200 and "<form" in response.text:
                    action = urljoin(str(response.url), response.text.split('action="')[1].split('"')[0])
                    response = await browser.post(action, data={"login": login})
                else:
                    raise SystemExit(f"fail: the provider answered {response.status_code}: {response.text[:300]}")
            raise SystemExit("fail: too many redirects at the provider")

    async def callback() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(code=caught["code"], state=caught["state"], iss=caught["iss"])

    storage = MemoryStorage()
    auth = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="plexus sso test",
            redirect_uris=[redirect_uri],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=browse,
        callback_handler=callback,
    )
    http = create_mcp_http_client(auth=auth)
    with anyio.fail_after(120):
        async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            tools = await client.list_tools()
            names = sorted(tool.name for tool in tools.tools)
    token = storage.tokens.access_token if storage.tokens else None
    print(json.dumps({"tools": names, "access_token": token}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--login", required=True)
    parser.add_argument("--redirect-uri", required=True)
    args = parser.parse_args()
    anyio.run(run, args.url, args.login, args.redirect_uri)


if __name__ == "__main__":
    main()
