"""Example scripts, installed with the package so ``daliload demo`` can run them.

``daliload/examples/train_ddp.py`` is a symbolic link to the repository's
``examples/train_ddp.py``: one file, read where users look for examples and
importable as ``daliload.examples.train_ddp`` (``torchrun -m
daliload.examples.train_ddp ...``) from a wheel, which stores the file's
contents (setuptools copies through the link). The alternatives were worse: a
second copy drifts, and a stub in ``examples/`` would hide the script from the
people it is written for. Symbolic links need a POSIX checkout; DALI only
ships Linux wheels, so that costs nothing here.
"""
