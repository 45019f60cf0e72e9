"""exporter/sinks/prometheus"""
