"""Scrape-time collectors: each renders the latest sampled state, never calls NVML.

One collector per file (node_exporter style); each builds a fresh set of metric families on
every ``collect()``, so a device or process that disappeared takes its series with it.
"""
