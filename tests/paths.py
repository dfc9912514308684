"""Where the tests find their inputs: the shipped examples and the SAPP-PPB sample."""
from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "gpuknap", "examples")
#: The spec's SAPP-PPB sample when this checkout sits beside it, else the shipped copy.
SHARED = os.path.join(ROOT, "..", "shared", "cases", "sapp_ppb_demo.json")
PACKAGED = os.path.join(EXAMPLES, "sapp_ppb_demo.json")
SAMPLE = SHARED if os.path.exists(SHARED) else PACKAGED
