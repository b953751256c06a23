"""Imported first by every perf/ script: the collectx of this checkout wins over an installed one.

Python puts a script's own folder (perf/) on sys.path, not the checkout, so without this an older
``pip install .`` in site-packages would be what a benchmark run from a source tree measures. A
fresh clone still works: the checkout's collectx finds the native library that ``pip install .``
put in site-packages (collectx/_native.py searches there).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
