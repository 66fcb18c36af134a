"""Adapters for the loaders daliload is compared with, one module each (see benchmarks.loaders)."""
