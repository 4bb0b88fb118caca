"""Prints the YAML documents of the files named as one JSON array, each document
with the file it came from under `__file`, for tests/tests/e2e/kubernetes.rs.

    target/python-venv/bin/python tests/python/yaml_to_json.py FILE...
"""

import json
import os
import sys

import yaml


def main() -> int:
    documents = []
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as file:
            for document in yaml.safe_load_all(file):
                if document is None:
                    continue
                document["__file"] = os.path.basename(path)
                documents.append(document)
    json.dump(documents, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
