"""exporter/sources"""
