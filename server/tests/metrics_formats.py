#!/usr/bin/env python3
"""Parses a metrics exposition read from stdin with one of the two parsers of
Python's prometheus_client, for server/tests/metrics_formats.rs.

    metrics_formats.py classic       # prometheus_client.parser (text format 0.0.4)
    metrics_formats.py openmetrics   # prometheus_client.openmetrics.parser

Prints one JSON object: the package's version and every family as the parser
returned it (name, type, help, samples with their labels; values as text, so
NaN and infinities survive JSON). Exits 2 when prometheus_client cannot be
imported and 1 when the parser refuses the text, with the reason on stderr.
"""

import json
import sys


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("classic", "openmetrics"):
        print(__doc__, file=sys.stderr)
        return 64
    try:
        import prometheus_client
        from prometheus_client.parser import text_string_to_metric_families as classic
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
    except ImportError as e:
        print(f"prometheus_client is not installed ({e}): pip install -r .ci/requirements-metrics.txt", file=sys.stderr)
        return 2
    try:
        from importlib.metadata import version

        installed = version("prometheus-client")
    except Exception:  # an unusual install: report what the module says
        installed = getattr(prometheus_client, "__version__", "unknown")
    parse = classic if sys.argv[1] == "classic" else openmetrics
    text = sys.stdin.read()
    try:
        families = [
            {
                "name": family.name,
                "type": family.type,
                "help": family.documentation,
                "samples": [
                    {"name": s.name, "labels": dict(sorted(s.labels.items())), "value": repr(float(s.value))}
                    for s in family.samples
                ],
            }
            for family in parse(text)
        ]
    except Exception as e:  # the parser's refusal is the test's finding
        print(f"the {sys.argv[1]} parser refused the text: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    json.dump({"version": installed, "families": families}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
