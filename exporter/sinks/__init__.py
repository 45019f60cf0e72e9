"""exporter/sinks"""
