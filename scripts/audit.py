"""Known-vulnerability audit of the installed dependency set (pip-audit), as CI runs it.

Audits every distribution in the virtualenv (gpuscope's runtime dependencies, the dashboard's
and the test tools: a superset of what the image ships) against PyPI's vulnerability data and
fails on any known vulnerability, printing one line per finding.

pip-audit asks PyPI's per-release JSON API. Where that API is not reachable (a mirror that
serves only the simple index answers 404 for every release), nothing can be audited; that is
reported in one line, and it fails the run only with ``GPUSCOPE_AUDIT_STRICT=1`` so that CI
without internet is not red for a reason unrelated to the code. A CI with internet should
set it.

    python scripts/audit.py            # from the repository root, with .venv active
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main() -> int:
    proc = subprocess.run(
        [sys.executable, "-m", "pip_audit", "--skip-editable", "--progress-spinner", "off",
         "--format", "json", "--desc", "off"],
        capture_output=True, text=True, timeout=600,
    )
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"audit: pip-audit failed (exit {proc.returncode}): {tail}", file=sys.stderr)
        return 1
    deps = report.get("dependencies", [])
    audited = [d for d in deps if "skip_reason" not in d]
    editable = [d for d in deps if "editable" in d.get("skip_reason", "")]
    findings = [(d["name"], d["version"], v) for d in audited for v in d.get("vulns", [])]
    for name, version, vuln in findings:
        fixed = ", ".join(vuln.get("fix_versions", [])) or "no fixed release"
        print(f"audit: {name} {version}: {vuln.get('id')} (fixed in {fixed})", file=sys.stderr)
    if findings:
        return 1
    unaudited = len(deps) - len(audited) - len(editable)
    if not audited and unaudited:
        strict = os.environ.get("GPUSCOPE_AUDIT_STRICT") == "1"
        print(f"audit: {'FAILED' if strict else 'WARNING'}: 0 of {unaudited} distributions "
              "could be audited: the vulnerability service answered 'not found' for all of "
              "them (no internet, or a mirror without PyPI's JSON API)", file=sys.stderr)
        return 1 if strict else 0
    print(f"audit: {len(audited)} distributions audited, no known vulnerabilities"
          + (f" ({unaudited} could not be audited)" if unaudited else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
