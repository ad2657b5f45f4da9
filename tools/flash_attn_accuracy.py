"""The whole float32 accuracy grid of tests/test_flash_attention_accuracy.py
(flash-attention's rule: the kernel's max error against float64 at most 2x
that of plain float32 in Paddle), one line per case, worst ratio last.

Run from the repository root: python tools/flash_attn_accuracy.py [--head-dims 32,64]
Exit status 1 when a case misses the rule.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.test_flash_attention_accuracy import GRADS, HEAD_DIMS, RULE, SHAPES, error_ratios  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    args = parser.parse_args()
    start, worst, misses, cases = time.perf_counter(), 0.0, 0, 0
    for d in (int(x) for x in args.head_dims.split(",")):
        for sq, sk in SHAPES:
            for causal in (False, True):
                errors = error_ratios(d, sq, sk, causal)
                cells = []
                for name in GRADS:
                    ours, plain = errors[name]
                    ratio = ours / plain
                    worst, misses, cases = max(worst, ratio), misses + (ratio > RULE), cases + 1
                    cells.append(f"{name} {ratio:4.2f}{'!' if ratio > RULE else ' '}")
                print(f"d={d:3d} {sq:4d}x{sk:4d} {'causal' if causal else 'full  '}  " + "  ".join(cells), flush=True)
    print(f"{misses} of {cases} errors above {RULE}x plain float32; worst ratio {worst:.2f}; "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
