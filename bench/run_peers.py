#!/usr/bin/env python3
"""flashkv's peers (python/flashkv/bench/peers) from a checkout, without building flashkv:

    python3 bench/run_peers.py --peers torch --kinds decode --out peers-decode.json
    python3 bench/run_peers.py --merge flashkv-decode.json peers-decode.json --md t.md --plots DIR

The same as `python -m flashkv.bench.peers` with flashkv installed (--help lists the options).
The peers are torch code and need nothing compiled, but importing the `flashkv` package loads its
compiled extension; so this registers `flashkv` and `flashkv.bench` as bare packages over the
source folders (their __init__ files do not run) and imports only the pure-Python modules below.
"""
import os
import sys
import types

SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "flashkv")


def bare_package(name, path):
    package = types.ModuleType(name)
    package.__path__ = [os.path.abspath(path)]
    sys.modules[name] = package


if __name__ == "__main__":
    bare_package("flashkv", SOURCES)
    bare_package("flashkv.bench", os.path.join(SOURCES, "bench"))
    from flashkv.bench.peers.cli import main

    sys.exit(main())
