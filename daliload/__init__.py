"""daliload: Kinetics-style video loading for PyTorch DDP with NVIDIA DALI."""
