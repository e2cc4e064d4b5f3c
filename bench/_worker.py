"""One worker process of any system under test (see `bench.adapter` for its stdout protocol).

``python -m bench._worker MODULE --url URL --options JSON`` imports ``MODULE`` (e.g.
``bench.drumbeat_system``, ``bench.peers.rq``) and runs its ``worker_main(url, options)``,
which stops on SIGTERM and then reports.
"""

from __future__ import annotations

import argparse
import importlib
import json

from .adapter import protocol_stdout

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("module")
    parser.add_argument("--url", required=True)
    parser.add_argument("--options", default="{}", help="JSON object of system options")
    args = parser.parse_args()
    protocol_stdout()
    module = importlib.import_module(args.module)
    module.worker_main(args.url, json.loads(args.options))
