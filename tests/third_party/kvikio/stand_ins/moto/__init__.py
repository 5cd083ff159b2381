"""Stands in for moto (not in Debian, and PyPI is out of reach in CI) in KvikIO's test_s3_io.py:
only ``moto.server.ThreadedMotoServer``, which that file uses, here an s3rver (server.py)."""
