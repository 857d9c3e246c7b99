"""Diagnostic (session 17): with ``NOADD=1`` the semantic router makes no finished prompt a donor (its
``_register_donor`` does nothing), so no donor-thread add can overlap a decision. Used through
``EXTRA_PYTHONPATH`` of ``benchmarks/results/route12/frontend_ab.sh``; the decisions are the same (the benchmark's
span-path prompts hold seeded donors only)."""

import os

if os.environ.get("SEMBLEND_ENABLED") == "1" and os.environ.get("NOADD") == "1":
    import semblend_dynamo.router.handler as H

    H.SemanticRouter._register_donor = lambda self, routed, served: None
