import os
import sys

# tests import their shared helpers (attention_cases, helpers) as top-level modules
sys.path.insert(0, os.path.dirname(__file__))
