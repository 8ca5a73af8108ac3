"""Test doubles that stand in for hardware a machine lacks, kept apart from the API as NumPy
and CuPy keep theirs: `fakegpu` (host memory posing as CUDA devices behind CuPy's API, used by
workers under MWRT_FAKE_GPUS) and `fakenccl` (CuPy's NCCL API over loopback TCP)."""
