"""The fastest row of an expert_step_bench.py sweep, as `step_config_ab.py --new` takes it ('name=value ...',
its fields that differ from the first row's), printed if it took at most RATIO of the first row's time;
exit status 1 (nothing printed) if no row did.

    python benchmarks/pick_row.py $R/kernel_expert_step_sweep37.json 0.99
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    path, ratio = sys.argv[1], float(sys.argv[2])
    rows = json.load(open(path))["configs"]
    base, best = rows[0], min(rows[1:], key=lambda r: r["us"])
    if best["us"] > ratio * base["us"]:
        print(f"no row within {ratio} of the first's {base['us']:.1f} us (fastest {best['us']:.1f})", file=sys.stderr)
        return 1
    # the unfitted configs: fitted fields (splits 0, merge_bd 0, qkv_pairs -1) stay as the sweep set them
    changed = {k: v for k, v in best["config"].items() if v != base["config"][k]}
    print(" ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in changed.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
