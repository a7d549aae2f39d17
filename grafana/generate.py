"""Writes the batchscope Grafana dashboards (grafana/dashboards/*.json), built with grafana-foundation-sdk.

    python grafana/generate.py          # rewrite the committed JSON
    python grafana/generate.py --check  # exit 1 if the committed JSON differs from what this file generates

The dashboards are built in dashboard_overview.py and dashboard_comparison.py from the parts in
dashboard_parts.py (sibling modules: run this file as a script). Query rules (recording rules, rate and range
windows) and what each row answers: docs/dashboards.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dashboard_comparison import comparison
from dashboard_overview import overview
from grafana_foundation_sdk.cog.encoder import JSONEncoder

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboards"


def render() -> dict[Path, str]:
    """File name -> JSON text, exactly as committed."""
    return {DASHBOARD_DIR / f"{name}.json": json.dumps(build(), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"
            for name, build in (("overview", overview), ("comparison", comparison))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is out of date")
    args = parser.parse_args(argv)
    stale = [path for path, text in render().items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path} differs from grafana/generate.py; run: python grafana/generate.py", file=sys.stderr)
        return 1 if stale else 0
    DASHBOARD_DIR.mkdir(parents=True, exist_ok=True)
    for path, text in render().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
