"""daliload's benchmarks (source checkout only): ``python -m benchmarks --help``."""
