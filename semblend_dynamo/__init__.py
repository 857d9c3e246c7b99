"""semblend-dynamo: semantic donor discovery for NVIDIA Dynamo and TensorRT-LLM.

Exact prefix reuse always wins first; semantic evidence is advisory; the backend is authoritative.
"""

__version__ = "0.1.0"
