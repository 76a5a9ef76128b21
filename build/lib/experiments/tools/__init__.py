"""Entry points that are not run.py jobs: head training and latency measurements, configured by conf/"""
