"""Re-key a SQLite database's records from one tree's template fingerprints to another's: for a template change
that leaves every kernel those records timed byte for byte as it was (a new knob whose off position renders the
old source: NOTES G-bwd20, 70, G10). Check that first (render both trees' templates); this script trusts it.

    python benchmarks/rekey_records.py OLD_TREE NEW_TREE DB

Prints each fingerprint it moves (named by the first family, direction and gates that hash to it) and how many
variants carried it; records of other fingerprints stay."""

import argparse
import json
import os
import sqlite3
import subprocess
import sys

# Run in each tree (its autoflash, its templates): every family, direction and combination of variant gates.
FINGERPRINTS = """
import itertools, json
from autoflash import codegen, families
from autoflash.problem import VARIANTS
out = {}
for family in families.FAMILIES:
    for direction in families.DIRECTIONS:
        for size in range(len(VARIANTS) + 1):
            for gates in itertools.combinations(sorted(VARIANTS), size):
                try:
                    out[f"{family} {direction} {'+'.join(gates)}"] = codegen.template_fingerprint(
                        family, direction, frozenset(gates))
                except Exception:  # (a family without this direction)
                    pass
print(json.dumps(out))
"""


def fingerprints(tree: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    done = subprocess.run([sys.executable, "-c", FINGERPRINTS], cwd=tree, env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old_tree")
    parser.add_argument("new_tree")
    parser.add_argument("db", help="SQLite file")
    args = parser.parse_args(argv)
    old, new = fingerprints(args.old_tree), fingerprints(args.new_tree)
    connection = sqlite3.connect(args.db)
    with connection:
        for key, before in sorted(old.items()):
            after = new.get(key)
            if after is None or after == before:
                continue
            direction = key.split()[1]
            moved = connection.execute("UPDATE autoflash_variants SET fingerprint = ? WHERE direction = ? AND "
                                       "fingerprint = ?", (after, direction, before)).rowcount
            if moved:
                print(f"{key or 'plain'}: {before} -> {after}, {moved} variants")
    connection.close()


if __name__ == "__main__":
    sys.exit(main())
