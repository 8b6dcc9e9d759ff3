"""Fidelity: predicted vs measured step times of the published runs (shared/validation/dev_runs.json).

    python benchmarks/bench_fidelity.py [--runs PATH] [--catalog OVERLAY] [--calibrate] [--json]

Prints every run (measured and predicted step, signed error, whether the priced plan fits,
the time breakdown), the skipped rows with their reasons, the summary (median and p90 of
|error|, worst run) and the per-source table; then the activation-memory check against
Korthikanti et al. 2022. `--calibrate` also fits the catalog's efficiency factors on the
same runs (into a temporary overlay) and prints the table again with them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoshard.calibrate import calibrate, format_calibration  # noqa: E402
from autoshard.validate import format_korthikanti, format_report, korthikanti_check, validate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", help="runs file (default: shared/validation/dev_runs.json or $AUTOSHARD_VALIDATION)")
    ap.add_argument("--catalog", help="calibrated catalog overlay to apply")
    ap.add_argument("--calibrate", action="store_true", help="also fit the efficiency factors and re-validate")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    report = validate(args.runs, catalog=args.catalog)
    dt = time.perf_counter() - t0
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
        return 0
    print(format_report(report))
    print(f"\n({report.summary.n} runs evaluated in {dt:.2f} s)")
    print("\nActivation memory per layer vs Korthikanti et al. 2022 (GPT-3 175B layer, s=2048, b=1, t=8, "
          "no FlashAttention):")
    print(format_korthikanti(korthikanti_check()))
    if args.calibrate:
        with tempfile.TemporaryDirectory(prefix="autoshard-fidelity-") as tmp:
            out = Path(tmp) / "calibrated.yaml"
            t0 = time.perf_counter()
            result = calibrate(report.runs_path, out, base_catalog=args.catalog)
            dt = time.perf_counter() - t0
            print(f"\nCalibration on the same runs ({dt:.1f} s):")
            print(format_calibration(result))
            print("\nWith the calibrated catalog:")
            print(format_report(validate(report.runs_path, catalog=out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
