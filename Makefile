# Convenience targets. The README's two commands (scripts/demo, scripts/test) are the
# supported entry points; these add the long-running checks that stay out of CI.
.PHONY: demo test load soak fuzz audit bench

demo:
	scripts/demo

test:
	scripts/test

# wrk against /metrics (8 GPUs x 64 processes, 32 pods, 100 connections, 60 s) and against the
# dashboard's main page (10 users, embedded and Prometheus modes): docs/reliability.md.
load:
	scripts/setup --bench
	.venv/bin/python bench/load.py

# The exporter at --interval 0.1 on the live path with pods and processes churning, 65 minutes:
# RSS, open files and threads must stay flat, no stale series (docs/reliability.md).
soak:
	scripts/setup --bench
	.venv/bin/python bench/soak.py

# The fuzz tests of tests/fuzz with N random examples per property (CI runs a fixed,
# derandomized set of a few hundred): make fuzz N=20000
N ?= 5000
fuzz:
	scripts/setup --test
	GPUSCOPE_FUZZ_EXAMPLES=$(N) .venv/bin/python -m pytest -q -p no:cacheprovider --timeout=0 tests/fuzz tests/exporter/kubernetes/podresources/test_fuzz_answers.py

audit:
	scripts/setup --test
	GPUSCOPE_AUDIT_STRICT=1 .venv/bin/python scripts/audit.py

# The exporter benchmark (CPU, RSS, scrape latency) in the budget's configuration, the one
# docs/benchmarks.md's exporter figures are for: the C double of libnvidia-ml, as the image runs it.
bench:
	scripts/setup --bench
	.venv/bin/python bench/exporter_bench.py --source nvml-c --as-image
