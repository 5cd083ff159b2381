"""Test-harness stand-in for moto (not installable here: no PyPI, not in Debian bookworm):
moto.server.ThreadedMotoServer runs s3rver 3.7.1 (ferry's .cache/node) instead."""
