"""SemBlend evidence events: versioned schemas, the msgpack codec, NATS subjects and transport.

Public API: :mod:`.schemas` (``DonorHint``, ``RouteEvidence``, ``DonorRegistration``, ``DonorLifecycle``,
``OutcomeReport``, ``request_key``, ``deployment_digest``, Dynamo ``Kv*`` events), :mod:`.codec`
(``encode``, ``decode``, ``decode_kv_events``, ``RejectedMessage``) and :mod:`.subjects` (``Subjects``).
"""
