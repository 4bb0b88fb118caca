"""A person on another device for `plexus login --device` tests: opens the
verification URI with a cookie jar, enters the user code, signs in on the
provider's login form as --login and confirms, filling each form it is shown
(standard library only).

    python oauth_device.py --login alice --code USER_CODE VERIFICATION_URI
"""

import argparse
import html
import http.cookiejar
import re
import sys
import urllib.parse
import urllib.request

FORM = re.compile(r"<form\b([^>]*)>(.*?)</form>", re.S | re.I)
INPUT = re.compile(r"<input\b([^>]*)>", re.I)
ATTR = re.compile(r'([a-z_-]+)="([^"]*)"', re.I)


def attrs(tag: str) -> dict:
    return {key.lower(): html.unescape(value) for key, value in ATTR.findall(tag)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--login", required=True)
    parser.add_argument("--code", required=True)
    parser.add_argument("uri")
    args = parser.parse_args()
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    response = opener.open(args.uri, timeout=30)
    # Code entry, then the login form, then the confirmation: each page's first
    # form, its hidden fields kept and the visible ones filled in.
    for _ in range(8):
        page = response.read().decode()
        form = FORM.search(page)
        if form is None:
            if "Success" in page:
                print(f"ok: {response.status} at {urllib.parse.urlsplit(response.url).path}")
                return
            print(f"fail: no form at {response.url}: {page[:300]}")
            sys.exit(1)
        action = urllib.parse.urljoin(response.url, attrs(form.group(1)).get("action", ""))
        fields = {}
        for tag in INPUT.findall(form.group(2)):
            field = attrs(tag)
            name = field.get("name")
            if name is None:
                continue
            if name == "user_code":
                fields[name] = args.code
            elif name == "login":
                fields[name] = args.login
            elif field.get("type", "text") == "hidden":
                fields[name] = field.get("value", "")
        data = urllib.parse.urlencode(fields).encode()
        response = opener.open(action, data=data, timeout=30)
    print("fail: too many forms")
    sys.exit(1)


if __name__ == "__main__":
    main()
