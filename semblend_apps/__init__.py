"""Applications on top of semblend-dynamo: the ``semblend-dynamo`` CLI, replay and the reference engine.

The floors below (``semblend_dynamo`` core and router, ``trtllm_connector``) never import from here.
"""
