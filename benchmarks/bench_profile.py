"""Time of `cryocube list models --profile` on this machine: the whole table measured cold (an empty
cache), then read back warm (every row a cache hit), and the small configs on their own.

    python benchmarks/bench_profile.py --short   # the small configs only (target: under a minute)
    python benchmarks/bench_profile.py           # all 20 configs, then the small ones, then warm
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryocube.models import list_models  # noqa: E402
from cryocube.models import profile as prof  # noqa: E402

# < 12 GFLOPs per sample each
SMALL = ["ssl4eo_moco", "ssl4eo_mae_sar", "remoteclip", "satlasnet_si"]


def timed(models, root: str, precision: str, device: str) -> prof.Profile:
    t = time.perf_counter()
    setups = prof.validate(models, None, 1, precision, device)
    p = prof.profile(setups, root=root, progress=False)
    # validation (meta-device dry runs) included, as the command does it
    p.seconds = time.perf_counter() - t
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help=f"only {', '.join(SMALL)}")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help=(
            "torch threads (default 1: on a shared machine multi-thread OpenMP barriers stall on"
            " busy cores)"
        ),
    )
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as root:
        runs = [("small configs, cold", SMALL)]
        if not args.short:
            runs = [("all configs, cold", list_models()), ("small configs, cold", SMALL)]
        for label, models in runs:
            with tempfile.TemporaryDirectory(prefix="cold-", dir=root) as cold:
                p = timed(models, cold, args.precision, args.device)
                print(
                    f"{label}: {len(p.rows)} configs in {p.seconds:.1f} s on {p.device} "
                    f"({p.rows[0]['precision']}, {p.rows[0]['threads']} threads)",
                    flush=True,
                )
                if label.startswith("all"):
                    print(prof.table(p), flush=True)
                w = timed(models, cold, args.precision, args.device)
                print(
                    f"{label.split(',')[0]}, warm (cache hits {w.cached}/{len(w.rows)}):"
                    f" {w.seconds:.1f} s",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
