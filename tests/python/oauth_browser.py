"""A "browser" for `plexus login` tests, given as $BROWSER: opens the authorization
URL with a cookie jar, signs in on the provider's login form as --login, and
follows the redirects to the loopback callback plexus listens on (standard
library only).

    BROWSER="python oauth_browser.py --login alice [--log FILE]" plexus login NAME
"""

import argparse
import http.cookiejar
import re
import sys
import urllib.parse
import urllib.request


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--login", required=True)
    parser.add_argument("--log")
    parser.add_argument("url")
    args = parser.parse_args()
    log = open(args.log, "a") if args.log else sys.stderr
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    try:
        response = opener.open(args.url, timeout=30)
        page = response.read().decode()
        form = re.search(r'action="([^"]+)"', page)
        if form is None:
            print(f"fail: no login form at {response.url}: {page[:200]}", file=log)
            sys.exit(1)
        action = urllib.parse.urljoin(response.url, form.group(1))
        data = urllib.parse.urlencode({"login": args.login}).encode()
        # The provider answers 303s: consent, then the redirect to plexus's loopback.
        done = opener.open(action, data=data, timeout=30)
        print(f"ok: {done.status} at {urllib.parse.urlsplit(done.url).path}", file=log)
    except Exception as error:  # noqa: BLE001 - reported for the test's failure message
        print(f"fail: {error!r}", file=log)
        sys.exit(1)


if __name__ == "__main__":
    main()
