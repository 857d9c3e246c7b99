"""The connector metadata: what the scheduler (rank 0) tells every worker to do this iteration.

``build_connector_meta`` returns one :class:`ConnectorMetadata`; TensorRT-LLM pickles it, broadcasts it to all
ranks and binds it with ``bind_connector_meta``. It holds plain data only.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PlanRow = tuple[int, int, int, int, int, int]
"""``(src_block, src_offset, dst_block, dst_offset, n_tokens, delta)``: one run of tokens inside one source block
and one destination block; K is rotated by ``delta`` positions, V copied. Every layer is copied."""


class LoadPlan(BaseModel):
    """Donor KV to write into one request's newly allocated blocks."""

    model_config = ConfigDict(frozen=True)

    request_id: int
    request_key: str
    donor_ids: tuple[str, ...]
    rows: tuple[PlanRow, ...]
    tokens: int = Field(gt=0, description="tokens promised (whole blocks)")
    blocks: int = Field(gt=0)
    delta: int = Field(description="position delta of the first span (0 for exact reuse)")
    requires_rope_correction: bool
    """Some row rotates K (delta != 0): the worker needs the model's RoPE."""
    lineage: str = Field("exact", description='"approximate" when the loaded KV differs from a fresh prefill')
    namespace: str
    mode: str
    promised_at: float = Field(description="time.perf_counter() at the promise, for end-to-end latency")
    role: str = Field("recipient", description="the request's audit role (semblend_dynamo.audit.Role)")
    trace_id: str | None = Field(None, description="joins the request's router and connector audit records")

    def is_whole_block_copy(self, tokens_per_block: int) -> bool:
        """Every row copies one whole block unshifted: a plain block copy, no head geometry needed."""
        return all(r[1] == 0 and r[3] == 0 and r[4] == tokens_per_block and r[5] == 0 for r in self.rows)


class ConnectorMetadata(BaseModel):
    """Everything the workers do in one iteration."""

    model_config = ConfigDict(frozen=True)

    loads: tuple[LoadPlan, ...] = ()
    releases: tuple[int, ...] = Field((), description="donor request ids to report as finished saving")
