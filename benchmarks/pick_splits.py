"""The key splits of the fastest correct row of a `suffix_attention_bench.py --splits-only` sweep, printed if it ran
another count than the default row's and took at most RATIO of its time; exit status 1 (nothing printed) if not.
`change_ab.py --change step_splits --step-splits N` then times that count in the whole call.

    python benchmarks/pick_splits.py $R/kernel_suffix_attention_b8_s37.json 0.98
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    path, ratio = sys.argv[1], float(sys.argv[2])
    rows = [r for r in json.load(open(path))["configs"] if "ms" in r and r["rel_l2"] < 1e-2]
    default = next(r for r in rows if r["splits"] is None)
    best = min(rows, key=lambda r: r["ms"])
    if best["effective_splits"] == default["effective_splits"] or best["ms"] > ratio * default["ms"]:
        print(f"the default's {default['effective_splits']} splits ({default['ms'] * 1e3:.1f} us) are within {ratio} of "
              f"the fastest ({best['effective_splits']} splits, {best['ms'] * 1e3:.1f} us)", file=sys.stderr)
        return 1
    print(best["effective_splits"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
