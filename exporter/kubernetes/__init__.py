"""exporter/kubernetes"""
